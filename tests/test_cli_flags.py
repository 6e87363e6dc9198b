"""One flag vocabulary across ``ssl-rec``: ``--ckpt_path`` everywhere, underscores, old spellings
still accepted with a one-line notice; one parser stack (LightningCLI / jsonargparse).

Parsers are checked in-process through each subcommand's ``--help``; the old spellings are
driven up to the first thing they name (a missing checkpoint), so no model is built.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ssl_rec.cli import main, run
from ssl_rec.cli.commands import SUBCOMMANDS
from ssl_rec.cli.flag_vocabulary import canonical_flags

ROOT = Path(__file__).resolve().parents[1]
_OPTION_LINE = re.compile(r"^  (--[\w.\-\[\]]+)", re.M)  # an option's own line in a help text


def _help(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_subcommand_takes_ckpt_path_and_only_underscored_flags(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _help(command, capsys)
    options = _OPTION_LINE.findall(text)
    assert "--ckpt_path" in options, options
    assert "--ckpt" not in options and "--reference" not in options
    dashed = [o for o in options if "-" in o[2:].split(".")[0]]
    assert dashed == [], f"ssl-rec {command}: flags with dashes {dashed}"


def test_every_subcommand_runs_on_one_parser_stack() -> None:
    """No argparse parser of its own: jsonargparse (LightningCLI is built on it) parses all."""
    for name, command in SUBCOMMANDS.items():
        if command.entry is None:
            continue  # LightningCLI's fit / validate / test / predict
        module = command.entry.partition(":")[0]
        source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
        assert not re.search(r"^\s*(import|from) argparse\b", source, re.M), (name, module)
        assert "from jsonargparse import" in source, (name, module)


def test_old_spellings_become_the_current_ones_with_one_notice_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--ckpt", "a.ckpt", "--budget-ne=0.1", "--json-out", "x-y.json",
            "--data.init_args.some-key", "v", "--budget-ne", "0.2", "-h", "--",
            "--ckpt_path2"]  # fmt: skip
    assert canonical_flags(argv, {"--ckpt": "--ckpt_path"}) == [
        "--ckpt_path", "a.ckpt", "--budget_ne=0.1", "--json_out", "x-y.json",
        "--data.init_args.some-key", "v", "--budget_ne", "0.2", "-h", "--", "--ckpt_path2",
    ]  # fmt: skip
    notices = capsys.readouterr().err.splitlines()
    assert notices == [
        "ssl-rec: note: --ckpt is deprecated; use --ckpt_path",
        "ssl-rec: note: --budget-ne is deprecated; use --budget_ne",
        "ssl-rec: note: --json-out is deprecated; use --json_out",
    ]
    assert canonical_flags(["--ckpt_path", "a", "--out", "b"], {"--ckpt": "--ckpt_path"}) == [
        "--ckpt_path", "a", "--out", "b",
    ]  # fmt: skip
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("argv", "old"),
    [
        (["export", "--ckpt", "{ckpt}", "--out", "{out}"], "--ckpt"),
        (["evaluate-embeddings", "--ckpt={ckpt}"], "--ckpt"),
        (["quantize", "--ckpt", "{ckpt}", "--out", "{out}", "--budget-ne", "0.001"], "--ckpt"),
        (["explain", "--reference", "{ckpt}", "--candidate", "{out}"], "--reference"),
        (["monitor", "--reference", "{ckpt}", "--candidate", "{out}", "--json-out", "{out}"],
         "--reference"),
    ],
)  # fmt: skip
def test_old_spellings_still_work_with_a_notice(
    argv: list[str], old: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt, out = tmp_path / "missing.ckpt", tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main([a.format(ckpt=ckpt, out=out) for a in argv])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert f"ssl-rec: note: {old} is deprecated; use --ckpt_path" in lines
    # the old flag reached the command as --ckpt_path: it looked for that checkpoint
    assert lines[-1].startswith("ssl-rec: error:") and str(ckpt) in lines[-1], lines


def test_the_budget_message_names_the_current_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["quantize", "--ckpt_path", str(tmp_path / "c.ckpt"), "--out", str(tmp_path / "q"),
              "--budget-ne", "0"])  # fmt: skip
    err = capsys.readouterr().err
    assert "--budget_ne must be > 0" in err and "--budget-ne must" not in err


TINY = ["--data.init_args.n_train=2048", "--data.init_args.n_val=256",
        "--data.init_args.n_test=256", "--data.init_args.batch_size=256",
        "--data.init_args.synthetic.cardinality_scale=0.001"]  # fmt: skip


def test_plan_ckpt_path_plans_with_the_hit_rates_the_checkpoint_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ssl_rec.hardware.collection import MixedPrecisionEmbeddingCollection
    from ssl_rec.lightning import load_module

    cache = [f"--data.init_args.cache_dir={tmp_path / 'data'}"]
    main(["fit", "--config", str(ROOT / "configs/ctr/synthetic_int8_cache.yaml"),
          f"--trainer.default_root_dir={tmp_path / 'run'}", "--trainer.logger=false",
          "--trainer.enable_progress_bar=false", "--trainer.max_steps=4",
          "--trainer.limit_val_batches=1", *TINY, *cache])  # fmt: skip
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    plan = ["plan", "--config", str(ROOT / "configs/dist/synthetic_int8_row_wise.yaml"),
            "--world_size", "2", "--out", str(tmp_path / "plan.json"), *TINY, *cache]  # fmt: skip
    assumed = run(plan)
    measured = run([*plan, "--ckpt_path", str(ckpt)])
    assert {t.hit_rate for t in assumed.tables} == {0.05}  # uniform: the cached fraction
    [collection] = [m for m in load_module(ckpt).modules()
                    if type(m) is MixedPrecisionEmbeddingCollection]  # fmt: skip
    stats = collection.cache_stats()
    counted = [stats[f"table{i}/hit_rate"] for i in range(len(measured.tables))]
    assert [t.hit_rate for t in measured.tables] == pytest.approx(counted)
    assert {t.hit_rate for t in measured.tables} != {0.05}
