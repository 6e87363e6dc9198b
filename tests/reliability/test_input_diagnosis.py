"""Input files diagnosed like a colleague would, and output fit for a log.

A UTF-8 byte-order mark is dropped; a file separated by another character than its suffix
says gets one line naming the separator and ``--data.delimiter``, which then reads it; the
values that map to id 0 are told apart into rare-in-training and never-seen; a ``predict``
run says "predicting"; output sent to a pipe has plain progress lines, no redrawn bars; the
demo ends with where its runs and report are.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import torch

from ssl_rec.cli import main
from ssl_rec.cli.demo import closing_summary
from ssl_rec.cli.progress_lines import ProgressLinesBar, plain_progress_callbacks
from ssl_rec.data import PreprocessOptions, TabularDataModule
from ssl_rec.data import progress as progress_module
from ssl_rec.data.oov_report import describe_unseen
from ssl_rec.data.progress import PassProgress, ProgressLines
from ssl_rec.data.sources.tabular import check_delimiter, column_names
from ssl_rec.vocab import Vocabularies, Vocabulary

ROOT = Path(__file__).resolve().parents[2]
BOM = b"\xef\xbb\xbf"
COLUMNS = ["--data.label=clicked", "--data.dense=[price]", "--data.categorical=[user,item]"]
QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false"]  # fmt: skip


def _fit_args(path: Path, root: Path, *extra: str) -> list[str]:
    return ["fit", "--config", str(ROOT / "configs/ctr/tabular.yaml"), f"--data.path={path}",
            *COLUMNS, f"--data.init_args.cache_dir={root / 'cache'}", "--data.batch_size=512",
            "--trainer.max_steps=2", "--trainer.limit_val_batches=1",
            f"--trainer.default_root_dir={root / 'run'}", *extra]  # fmt: skip


def _one_error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run ``argv``; assert exit status 2 and one ``ssl-rec: error:`` line, and return it."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "ssl-rec: error:" in line]
    assert len(lines) == 1, err
    return lines[0]


# --- byte-order mark -------------------------------------------------------------------------


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path, write_clicks, packed):
    write_clicks(tmp_path / "plain.csv", n=400)
    data = BOM + (tmp_path / "plain.csv").read_bytes()
    path = tmp_path / ("bom.csv.gz" if packed else "bom.csv")
    path.write_bytes(gzip.compress(data) if packed else data)
    assert column_names(path) == ["clicked", "price", "user", "item"]
    dm = TabularDataModule(str(path), "clicked", ["price"], ["user", "item"],
                           cache_dir=str(tmp_path / "cache"))  # fmt: skip
    plain = TabularDataModule(str(tmp_path / "plain.csv"), "clicked", ["price"], ["user", "item"],
                              cache_dir=str(tmp_path / "cache"))  # fmt: skip
    assert dm.schema.label == "clicked"
    for split in ("train", "val", "test"):  # the same rows as without the mark
        assert dm.split_table(split).equals(plain.split_table(split))


def test_a_byte_order_mark_file_trains_through_the_cli_and_is_named_once(
    tmp_path, write_clicks, capsys
):
    write_clicks(tmp_path / "plain.csv", n=1200)
    (tmp_path / "bom.csv").write_bytes(BOM + (tmp_path / "plain.csv").read_bytes())
    main([*_fit_args(tmp_path / "bom.csv", tmp_path), *QUIET])
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    err = capsys.readouterr().err
    named = [line for line in err.splitlines() if "byte-order mark" in line]
    assert named == [f"{tmp_path / 'bom.csv'}: stripped a UTF-8 byte-order mark from the header"]
    main([*_fit_args(tmp_path / "plain.csv", tmp_path / "plain"), *QUIET])
    assert "byte-order mark" not in capsys.readouterr().err  # only files that have one


def test_utf16_text_is_one_line_asking_for_utf8(tmp_path, capsys):
    path = tmp_path / "wide.csv"
    path.write_bytes("clicked,price,user,item\n1,2.0,u1,i1\n".encode("utf-16"))
    line = _one_error_line(capsys, _fit_args(path, tmp_path))
    assert "wide.csv" in line and "UTF-16" in line and "UTF-8" in line


# --- separators ------------------------------------------------------------------------------


def _separated(tmp_path: Path, write_clicks, sep: str, name: str = "semi.csv") -> Path:
    write_clicks(tmp_path / "plain.csv", n=1200)
    path = tmp_path / name
    path.write_text((tmp_path / "plain.csv").read_text().replace(",", sep))
    return path


@pytest.mark.parametrize(("sep", "spelled"), [(";", "';'"), ("|", "'|'"), ("\t", "'\\t'")])
def test_another_separator_is_named_with_the_option(tmp_path, write_clicks, capsys, sep, spelled):
    path = _separated(tmp_path, write_clicks, sep)
    line = _one_error_line(capsys, _fit_args(path, tmp_path))
    assert f"error: {path} looks like a {spelled}-separated file: pass --data.delimiter " \
           f"{spelled}" in line  # fmt: skip
    assert "unknown columns" not in line and "available columns" not in line


def test_a_wrong_label_in_a_semicolon_file_names_the_separator(tmp_path, write_clicks):
    path = _separated(tmp_path, write_clicks, ";")
    dm = TabularDataModule(str(path), "clicked", [], ["clicked;price;user;item"],
                           cache_dir=str(tmp_path / "cache"))  # fmt: skip
    with pytest.raises(ValueError, match=r"looks like a ';'-separated file: pass --data.delimiter"):
        dm.schema  # noqa: B018


@pytest.mark.parametrize(("sep", "given"), [(";", ";"), ("\t", "\\t"), ("\t", "tab")])
def test_the_delimiter_option_reads_the_file(tmp_path, write_clicks, sep, given):
    path = _separated(tmp_path, write_clicks, sep)
    main([*_fit_args(path, tmp_path, f"--data.delimiter={given}"), *QUIET])
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    hparams = torch.load(ckpt, weights_only=True)["datamodule_hyper_parameters"]
    assert hparams["delimiter"] == given  # recorded: test/predict from it read the same layout
    plain = TabularDataModule(str(tmp_path / "plain.csv"), "clicked", ["price"], ["user", "item"],
                              cache_dir=str(tmp_path / "c2"))  # fmt: skip
    dm = TabularDataModule(str(path), "clicked", ["price"], ["user", "item"],
                           cache_dir=str(tmp_path / "c2"), delimiter=given)  # fmt: skip
    assert dm.split_table("train").equals(plain.split_table("train"))
    assert dm.data_dir != plain.data_dir  # the delimiter is part of the cache key


@pytest.mark.parametrize("bad", [";;", "", '"', "\n"])
def test_a_bad_delimiter_is_refused(bad):
    with pytest.raises(ValueError, match="delimiter must be one character"):
        check_delimiter(bad)


def test_a_bad_delimiter_is_one_line_at_the_command_line(tmp_path, write_clicks, capsys):
    write_clicks(tmp_path / "clicks.csv", n=300)
    line = _one_error_line(capsys, _fit_args(tmp_path / "clicks.csv", tmp_path,
                                             "--data.delimiter=;;"))  # fmt: skip
    assert "delimiter" in line


# --- rare vs never seen ----------------------------------------------------------------------


def _rows(path: Path, users: list[str]) -> None:
    path.write_text("clicked,price,user\n" + "".join(f"{i % 2},{i},{u}\n"
                                                     for i, u in enumerate(users)))  # fmt: skip


def _fitted(tmp_path: Path) -> TabularDataModule:
    """Training users: ``a`` x30, ``b`` x30 (kept), ``r1``..``r3`` once each (rare at 2)."""
    train = tmp_path / "data" / "train.csv"
    train.parent.mkdir()
    _rows(train, ["a"] * 30 + ["b"] * 30 + ["r1", "r2", "r3"])
    _rows(tmp_path / "data" / "valid.csv", ["a", "b"])
    _rows(tmp_path / "data" / "test.csv", ["a"])
    options = PreprocessOptions(min_frequency=2)
    dm = TabularDataModule(str(tmp_path / "data"), "clicked", ["price"], ["user"], options,
                           cache_dir=str(tmp_path / "cache"))  # fmt: skip
    assert dm.schema.metadata["training_rare_values"] == {"user": 3}
    return dm


def _encode_new(tmp_path: Path, vocabulary: Vocabularies, caplog) -> TabularDataModule:
    """A new file: 2 rare-in-training values (r1, r3 twice = 3), 2 never seen (n1, n2), known."""
    path = tmp_path / "new.csv"
    _rows(path, ["a", "r1", "r3", "r3", "n1", "n2", "b", ""])
    dm = TabularDataModule(str(path), "clicked", ["price"], ["user"],
                           PreprocessOptions(val_fraction=0, test_fraction=1),
                           cache_dir=str(tmp_path / "cache"))  # fmt: skip
    dm.use_vocabulary(vocabulary)
    with caplog.at_level(logging.INFO, logger="ssl_rec"):
        dm.schema  # noqa: B018
    return dm


def test_rare_and_never_seen_values_are_counted_apart(tmp_path, caplog):
    vocabulary = _fitted(tmp_path).vocabulary
    assert vocabulary["user"].rare_count == 3
    dm = _encode_new(tmp_path, vocabulary, caplog)
    meta = dm.schema.metadata
    assert meta["unseen_values"]["test"] == {"user": 5}  # the empty cell is missing, not unseen
    assert meta["rare_values"]["test"] == {"user": 3}
    text = caplog.text
    assert "test split (8 rows): 3 values seen fewer than min_frequency=2 times in the model's " \
           "training split (user 3) and 2 values never seen in training (user 2) map to id 0" \
           in text  # fmt: skip
    assert "unseen by the model's vocabulary" not in text


def test_the_rare_values_travel_in_checkpoints_and_files(tmp_path):
    vocabulary = _fitted(tmp_path).vocabulary
    state = torch.load(_saved(vocabulary.to_state(), tmp_path), weights_only=True)
    for again in (Vocabularies.from_state(state), Vocabularies.load(vocabulary.save(
            tmp_path / "v.arrow"))):  # fmt: skip
        user = again["user"]
        assert user.rare_count == 3
        np.testing.assert_array_equal(user.rare_hashes, vocabulary["user"].rare_hashes)
        assert user.rare_in_training(pa.array(["r2", "a", "zz"])).tolist() == [True, False, False]
        assert again.fingerprints() == vocabulary.fingerprints()  # ids unchanged


def test_malformed_rare_values_in_a_vocabulary_file_name_the_file(tmp_path):
    path = _fitted(tmp_path).vocabulary.save(tmp_path / "v.arrow")
    with pa.memory_map(str(path)) as source:
        table = pa.ipc.open_file(source).read_all()
    meta = json.loads(table.schema.metadata[b"ssl_rec"])
    meta["rare_hashes"] = ["not base64!"]
    table = table.replace_schema_metadata({"ssl_rec": json.dumps(meta)})
    bad = tmp_path / "bad.arrow"
    with pa.OSFile(str(bad), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    with pytest.raises(ValueError, match=r"bad\.arrow: malformed rare values"):
        Vocabularies.load(bad)


def _saved(state: dict, tmp_path: Path) -> Path:
    path = tmp_path / "state.pt"
    torch.save(state, path)
    return path


def test_a_vocabulary_without_rare_records_says_it_cannot_tell(tmp_path, caplog):
    vocabulary = _fitted(tmp_path).vocabulary
    old = vocabulary.to_state()  # as a checkpoint written before rare values were recorded
    for entry in old["fields"].values():
        entry.pop("rare_hashes"), entry.pop("rare_count")
    dm = _encode_new(tmp_path, Vocabularies.from_state(old), caplog)
    assert dm.schema.metadata["rare_values"]["test"] == {"user": None}
    assert "5 values not in the model's vocabulary, rare in training or never seen there " \
           "(user 5; the vocabulary does not record which) map to id 0" in caplog.text  # fmt: skip


def test_too_many_rare_values_are_counted_but_not_remembered(monkeypatch):
    import ssl_rec.vocab.field_vocabulary as vocabulary_module

    monkeypatch.setattr(vocabulary_module, "RARE_HASHES_MAX", 2)
    vocab = Vocabulary.fit(pa.array(["a", "x", "y", "z"]), np.array([5, 1, 1, 1]), 2)
    assert vocab.rare_count == 3 and vocab.rare_hashes is None
    assert vocab.rare_in_training(pa.array(["x"])) is None


def test_min_frequency_one_means_every_unknown_value_is_new():
    line = describe_unseen("val", 10, {"C1": 4, "C2": 0}, None, min_frequency=1)
    assert line == "val split (10 rows): 4 values never seen in training (C1 4) map to id 0"
    assert describe_unseen("val", 10, {"C1": 0}, None, 1) is None


# --- predict ---------------------------------------------------------------------------------


def test_a_predict_run_logs_predicting_not_test_split(tmp_path, write_clicks, caplog):
    write_clicks(tmp_path / "clicks.csv", n=1200)
    main([*_fit_args(tmp_path / "clicks.csv", tmp_path), *QUIET])
    (tmp_path / "new.csv").write_text("clicked,price,user,item\n1,3.0,u1,i1\n0,1.0,nobody,i1\n")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ssl_rec"):
        main(["predict", "--ckpt_path", str(tmp_path / "run" / "checkpoints" / "last.ckpt"),
              f"--data.path={tmp_path / 'new.csv'}", f"--predictions.out={tmp_path / 'p.csv'}",
              *QUIET])  # fmt: skip
    assert "predicting (2 rows): 1 values never seen in training (user 1) map to id 0" \
        in caplog.text  # fmt: skip
    assert "test split" not in caplog.text
    assert len((tmp_path / "p.csv").read_text().splitlines()) == 3


# --- output for logs -------------------------------------------------------------------------


def test_a_fit_into_a_pipe_prints_plain_lines_not_bars(tmp_path, write_clicks):
    write_clicks(tmp_path / "clicks.csv", n=3000)
    # One whole epoch (5 steps) and its validation: every kind of line a fit prints.
    args = _fit_args(tmp_path / "clicks.csv", tmp_path, "--trainer.logger=false",
                     "--trainer.max_steps=-1", "--trainer.max_epochs=1",
                     "--trainer.limit_val_batches=null")  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", "from ssl_rec.cli import main; main()", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:]
    assert "\r" not in out.stdout  # no bar redrawn in place
    assert "it/s]" not in out.stdout and "|#" not in out.stdout and "█" not in out.stdout
    lines = out.stdout.splitlines()
    assert len(lines) < 60, out.stdout
    epoch = [line for line in lines if line.startswith("epoch 0: 5 steps in ")]
    assert len(epoch) == 1 and "val/auc=" in epoch[0] and "train/loss=" in epoch[0], out.stdout
    assert any(line.startswith("count: 3") and "rows/s" in line for line in lines), out.stdout


def test_progress_lines_print_a_line_per_tenth_at_most():
    now = [0.0]
    stream = io.StringIO()
    lines = ProgressLines("count", total=1000, stream=stream, min_interval=2.0,
                          clock=lambda: now[0])  # fmt: skip
    for _ in range(1000):  # 1000 updates over 100 s
        now[0] += 0.1
        lines.update(1)
    lines.close()
    printed = stream.getvalue().splitlines()
    assert 9 <= len(printed) <= 11, printed
    assert printed[0] == "count: 100/1k rows (10%), 10 rows/s, 1 min 30 s left"
    assert printed[-1] == "count: 1k rows in 1 min 40 s (10 rows/s)"


def test_an_epoch_resumed_inside_is_timed_from_the_resume(monkeypatch):
    """Lightning calls no epoch start for an epoch resumed from a mid-epoch checkpoint."""
    now = [1000.0]  # the clock's origin is long before the fit (e.g. the machine's boot)
    stream = io.StringIO()
    bar = ProgressLinesBar(stream=stream, clock=lambda: now[0])
    monkeypatch.setattr(bar, "get_metrics", lambda trainer, pl_module: {})
    trainer = SimpleNamespace(current_epoch=0)
    bar.on_train_start(trainer, None)
    now[0] += 3.0
    bar.on_train_epoch_end(trainer, None)
    assert stream.getvalue().startswith("epoch 0: 0 steps in 3.0 s ("), stream.getvalue()


def test_preprocessing_progress_is_plain_off_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(progress_module, "output_is_terminal", lambda stream=None: False)
    bar = PassProgress("encode", total_bytes=1000)
    bar.update(rows=500, done_bytes=1000)
    bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err and err.startswith("encode: 500 rows in ")


def test_the_trainer_keeps_its_bar_on_a_terminal_or_when_told(monkeypatch):
    import ssl_rec.cli.progress_lines as lines_module

    monkeypatch.setattr(lines_module, "output_is_terminal", lambda stream=None: False)
    (added,) = plain_progress_callbacks({"callbacks": []}, [])
    assert isinstance(added, ProgressLinesBar)
    assert plain_progress_callbacks({"enable_progress_bar": False}, []) == []
    assert plain_progress_callbacks({"callbacks": [ProgressLinesBar()]}, []) == []
    monkeypatch.setattr(lines_module, "output_is_terminal", lambda stream=None: True)
    assert plain_progress_callbacks({"callbacks": []}, []) == []


# --- the demo's last lines -------------------------------------------------------------------


def test_the_demo_ends_with_its_runs_wandb_runs_next_step_and_report(tmp_path):
    for stage in ("ctr_full_labels", "pretrain"):
        (tmp_path / stage / "wandb" / f"offline-run-2026-{stage}").mkdir(parents=True)
    lines = closing_summary(tmp_path)
    assert lines[-1] == f"report: {tmp_path / 'report.json'}"
    runs = next(line for line in lines if line.startswith("runs "))
    assert str(tmp_path / "ctr_full_labels") in runs and str(tmp_path / "pretrain") in runs
    assert "ctr_few_labels_scratch" not in runs  # only the stages that ran
    wandb = next(line for line in lines if line.startswith("W&B offline runs"))
    assert wandb.startswith("W&B offline runs: 2 in <run>/wandb/")
    assert wandb.endswith(f"wandb sync {tmp_path}/*/wandb/offline-run-*)")
    assert any("source .venv/bin/activate" in line for line in lines)
    assert any("ssl-rec fit --config configs/ctr/tabular.yaml" in line for line in lines)
    assert len(lines) <= 7
