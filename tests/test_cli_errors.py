"""A user's mistake at the command line: one short message naming what and where, exit 2."""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ssl_rec.cli import main
from ssl_rec.cli import run as cli_run
from ssl_rec.cli.errors import summarize_parser_error

GOOD = "\t".join(["0"] + ["1"] * 13 + ["05db9164"] * 26)
TINY = ["--trainer.fast_dev_run=1", "--trainer.logger=false"]


def _criteo(tmp_path: Path, lines: list[str], name: str = "day_0.txt") -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _fit_criteo(path: Path, tmp_path: Path) -> list[str]:
    return ["fit", "--config", "configs/ctr/criteo.yaml", f"--data.path={path}",
            f"--data.init_args.cache_dir={tmp_path / 'cache'}", *TINY]  # fmt: skip


def _fit_synthetic(tmp_path: Path, *extra: str) -> list[str]:
    return ["fit", "--config", "configs/ctr/synthetic.yaml", "--data.init_args.n_train=500",
            f"--data.init_args.cache_dir={tmp_path / 'cache'}", *TINY, *extra]  # fmt: skip


def _truncated_gzip(tmp_path: Path) -> Path:
    data = gzip.compress("".join(GOOD + "\n" for _ in range(2000)).encode())
    path = tmp_path / "day_0.txt.gz"
    path.write_bytes(data[: len(data) // 2])
    return path


def _csv(tmp_path: Path) -> Path:
    path = tmp_path / "clicks.csv"
    path.write_text("clicked,price,user\n" + "".join(f"{i % 2},{i},u{i % 5}\n" for i in range(50)))
    return path


def _tiny_checkpoint(tmp_path: Path) -> str:
    root = tmp_path / "run"
    main([*_fit_synthetic(tmp_path, f"--trainer.default_root_dir={root}")])
    return str(next((root / "checkpoints").glob("*.ckpt")))


CASES = {
    "malformed criteo row": (
        lambda t: _fit_criteo(_criteo(t, [GOOD, GOOD, "0\t1\t2\t3"]), t),
        ["day_0.txt, line 3", "40"],
    ),
    "criteo label 2": (
        lambda t: _fit_criteo(_criteo(t, [GOOD, "2" + GOOD[1:]]), t),
        ["day_0.txt, line 2", "label", "0 or 1"],
    ),
    "criteo header line": (
        lambda t: _fit_criteo(
            _criteo(
                t,
                [
                    "\t".join(
                        [
                            "label",
                            *[f"I{i}" for i in range(1, 14)],
                            *[f"C{i}" for i in range(1, 27)],
                        ]
                    ),
                    GOOD,
                ],
            ),
            t,
        ),  # fmt: skip
        ["day_0.txt, line 1"],
    ),
    "missing data file": (
        lambda t: _fit_criteo(t / "nope" / "day_0.txt", t),
        ["nope/day_0.txt"],
    ),
    "missing config file": (
        lambda t: ["fit", "--config", str(t / "nope.yaml")],
        ["nope.yaml"],
    ),
    "unknown precision": (
        lambda t: _fit_synthetic(t, "--model.init_args.backbone.init_args.tables.precision=int3"),
        ["precision", "int3", "int8"],
    ),
    "cache fraction out of range": (
        lambda t: _fit_synthetic(t, "--model.init_args.backbone.init_args.tables.cache_fraction=2"),
        ["cache_fraction", "[0, 1]", "2"],
    ),
    "admission count below one": (
        lambda t: _fit_synthetic(
            t, "--model.init_args.backbone.init_args.tables.admission_count=0"
        ),
        ["admission_count", ">= 1", "got 0"],
    ),
    "negative learning rate": (
        lambda t: _fit_synthetic(t, "--model.init_args.learning_rate=-1"),
        ["learning_rate", "> 0", "-1"],
    ),
    "label fraction out of range": (
        lambda t: _fit_synthetic(t, "--data.init_args.label_fraction=1.5"),
        ["label_fraction", "1.5"],
    ),
    "missing checkpoint": (
        lambda t: ["export", "--ckpt_path", str(t / "none.ckpt"), "--out", str(t / "out")],
        ["none.ckpt"],
    ),
    "corrupt checkpoint": (
        lambda t: [
            "export",
            "--ckpt_path",
            str(_criteo(t, ["junk"], "bad.ckpt")),
            "--out",
            str(t / "out"),
        ],  # fmt: skip
        ["bad.ckpt", "not a readable checkpoint"],
    ),
    "truncated gzip file": (
        lambda t: _fit_criteo(_truncated_gzip(t), t),
        ["day_0.txt.gz"],
    ),
    "label column typo": (
        lambda t: [
            "fit",
            "--config",
            "configs/ctr/tabular.yaml",
            f"--data.path={_csv(t)}",
            "--data.label=clickd",
            "--data.dense=[price]",
            "--data.categorical=[user]",
            f"--data.init_args.cache_dir={t / 'cache'}",
            *TINY,
        ],  # fmt: skip
        ["clicks.csv", "clickd"],
    ),
    "unknown export field": (
        lambda t: [
            "export",
            "--ckpt_path",
            _tiny_checkpoint(t),
            "--out",
            str(t / "o"),
            "--fields",
            "[C1,NOPE]",
        ],  # fmt: skip
        ["NOPE"],
    ),
    "unknown export option": (
        lambda t: ["export", "--ckpt_path", "x.ckpt", "--out", str(t / "o"), "--nope", "1"],
        ["nope"],
    ),
    "data file given to the synthetic data module": (
        lambda t: [
            "fit",
            "--config",
            "configs/pretrain/contrastive.yaml",
            f"--data.path={_csv(t)}",
        ],
        [
            "--data.path",
            "SyntheticCTRDataModule",
            "reads no file",
            "--data configs/common/data/tabular_unlabeled.yaml --data.path FILE",
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_user_mistake_is_one_message_exit_2(case: str, tmp_path: Path, capsys) -> None:
    argv, expected = CASES[case]
    with pytest.raises(SystemExit) as exit_info:
        main(argv(tmp_path))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    # (a progress bar may precede the message on its line)
    message = [line.split("ssl-rec: error:")[1] for line in err.splitlines()
               if "ssl-rec: error:" in line]  # fmt: skip
    assert len(message) == 1, err
    assert "Traceback" not in err
    for part in expected:
        assert part in message[0], (part, message[0])


def test_debug_flag_shows_the_exception(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="label_fraction"):
        main([*_fit_synthetic(tmp_path, "--data.init_args.label_fraction=1.5"), "--debug"])


def test_console_script_prints_no_traceback(tmp_path: Path) -> None:
    """The installed entry point, in a fresh process: what a user sees."""
    code = "from ssl_rec.cli import main; main()"
    out = subprocess.run(
        [sys.executable, "-c", code, "fit", "--config", str(tmp_path / "missing.yaml")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "missing.yaml" in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 3, out.stderr


def test_help_lists_every_subcommand(capsys) -> None:
    from ssl_rec.cli.commands import SUBCOMMANDS

    main(["--help"])
    out = capsys.readouterr().out
    for name in ("fit", "validate", "test", "predict", *SUBCOMMANDS):
        assert f"\n  {name} " in out, name


def test_nested_parser_error_is_reduced_to_key_and_reason() -> None:
    message = (
        'Parser key "model":\n  Does not validate against any of the Union subtypes\n'
        "  Errors:\n    - Problem with given class_path 'X':\n"
        '        Parser key "tables":\n          Parser key "precision":\n'
        "            Expected a member of Precision. Got value: int3\n"
        "    - Expected a <class 'NoneType'>\n  Given value: NestedArg(...)"
    )
    assert summarize_parser_error(message) == (
        "model > tables > precision: Expected a member of Precision. Got value: int3"
    )


def test_synthetic_path_error_names_a_data_config_that_reads_the_file(
    tmp_path: Path, capsys
) -> None:
    pretrain = ["fit", "--config", "configs/pretrain/contrastive.yaml"]
    with pytest.raises(SystemExit):
        main([*pretrain, f"--data.path={_csv(tmp_path)}"])
    message = capsys.readouterr().err.strip().splitlines()[-1]
    data_config = re.search(r"--data (configs/\S+\.yaml) --data\.path FILE", message).group(1)
    cli = cli_run([*pretrain, "--data", data_config, f"--data.path={_csv(tmp_path)}",
                   "--data.dense=[price]", "--data.categorical=[user]",
                   f"--data.init_args.cache_dir={tmp_path / 'cache'}",
                   f"--trainer.default_root_dir={tmp_path / 'run'}", *TINY])  # fmt: skip
    assert type(cli.datamodule).__name__ == "TabularDataModule"
    assert cli.trainer.global_step == 1 and cli.datamodule.schema.field_names == ["user"]


def test_data_option_hint_only_for_file_options_of_modules_reading_no_file() -> None:
    from ssl_rec.cli.data_option_hint import data_option_hint

    def refused(module: str, option: str) -> str:
        return (
            'Parser key "data":\n  Errors:\n'
            f"    - Problem with given class_path '{module}':\n"
            f"        Option '{option}' is not accepted\n"
        )

    hint = data_option_hint(refused("ssl_rec.data.sources.movielens.MovieLensDataModule", "label"))
    assert hint.startswith("--data.label: the config's data module (MovieLensDataModule) reads")
    assert "--data configs/common/data/tabular.yaml" in hint
    assert data_option_hint(refused("ssl_rec.data.SyntheticCTRDataModule", "nope")) is None
    assert data_option_hint(refused("ssl_rec.data.CriteoDataModule", "dense")) is None
    assert data_option_hint("data: Option 'path' is not accepted") is None
