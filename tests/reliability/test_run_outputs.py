"""One place per run: checkpoint commands write beside the checkpoint's run, never into the
working directory and never over an earlier result; one W&B run per fit, which ``test`` and
``predict`` log into."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from cli_outcome import exit_code
from jsonargparse import Namespace

from ssl_rec.cli import main
from ssl_rec.cli.run_outputs import (
    GROUP_ENV,
    WANDB_RECORD,
    checkpoint_run_dir,
    set_wandb_run,
    wandb_group,
)

ROOT = Path(__file__).resolve().parents[2]
SSL_REC = Path(sys.executable).with_name("ssl-rec")
# One batch per epoch, so a fit of --trainer.max_steps=2 validates twice and writes best.ckpt.
COLUMNS = ["--data.label", "clicked", "--data.dense", "[price]",
           "--data.categorical", "[user,item]", "--data.batch_size=4096"]  # fmt: skip
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
NO_WANDB = ["--trainer.logger=false"]


def _fit(clicks: Path, root: Path, *extra: str) -> None:
    """A two-step CTR fit of the click log into ``root`` (W&B offline unless ``extra`` says)."""
    main(["fit", "--config", str(ROOT / "configs/ctr/tabular.yaml"), "--data.path", str(clicks),
          *COLUMNS, "--trainer.max_steps=2", f"--trainer.default_root_dir={root}", *QUIET,
          *extra])  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory, write_clicks) -> Path:
    """The run directory of a tiny fit that logged to W&B offline."""
    base = tmp_path_factory.mktemp("run_outputs")
    write_clicks(base / "clicks.csv", 600, users=30)
    _fit(base / "clicks.csv", base / "run")
    return base / "run"


def _offline_runs(directory: Path) -> list[str]:
    return sorted(p.name for p in (directory / "wandb").glob("offline-run-*"))


def test_test_from_another_directory_writes_beside_the_run_and_keeps_earlier_results(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    best = run / "checkpoints" / "best.ckpt"
    metrics = run / "metrics.json"
    main(["test", "--ckpt_path", str(best), *QUIET])
    assert list(cwd.iterdir()) == []  # no metrics.json, *_config.yaml or wandb/ here
    first = metrics.read_bytes()
    assert "test_auc" in json.loads(first)
    assert (run / "test_config.yaml").is_file()
    capfd.readouterr()

    assert exit_code(["test", "--ckpt_path", str(best), *QUIET]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ssl-rec: error:"), err  # one line, nothing else
    assert f"{metrics} already exists" in err[0] and "--overwrite true" in err[0], err
    assert metrics.read_bytes() == first
    assert list(cwd.iterdir()) == []

    metrics.write_text("{}")  # so that a rewrite shows
    main(["test", "--ckpt_path", str(best), "--overwrite", "true", *QUIET])
    assert "test_auc" in json.loads(metrics.read_text())
    assert list(cwd.iterdir()) == []


def test_a_fit_is_one_wandb_run_that_test_logs_into(run: Path, tmp_path: Path) -> None:
    """In a fresh process: wandb prints its "anonymous setting" warning once per process."""
    record = json.loads((run / WANDB_RECORD).read_text())
    assert record["group"] == record["name"] == run.name
    fit_runs = _offline_runs(run)
    assert fit_runs and all(name.endswith(f"-{record['id']}") for name in fit_runs)
    out = tmp_path / "elsewhere"
    argv = ["test", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"),
            f"--trainer.default_root_dir={out}", *QUIET]  # fmt: skip
    done = subprocess.run([str(SSL_REC), *argv], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "WANDB_MODE": "offline"}, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    tested = _offline_runs(out)
    assert len(tested) == 1 and tested[0].endswith(f"-{record['id']}"), tested  # the fit's run
    assert (out / "metrics.json").is_file() and not (out / WANDB_RECORD).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere"]
    assert "anonymous" not in done.stdout + done.stderr


def test_a_fit_of_a_relative_path_is_tested_from_elsewhere_with_no_wandb_warning(
    tmp_path: Path, write_clicks
) -> None:
    """The README's way: ``fit --data.path clicks.csv`` in the data's folder, W&B on (offline),
    then ``test --ckpt_path`` of its ``best.ckpt`` from another folder, each a fresh process."""
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    data.mkdir(), elsewhere.mkdir()
    write_clicks(data / "clicks.csv", 600, users=30)
    env = {**os.environ, "WANDB_MODE": "offline"}
    fit = ["fit", "--config", str(ROOT / "configs/ctr/tabular.yaml"), "--data.path", "clicks.csv",
           *COLUMNS, "--trainer.max_steps=2", "--trainer.default_root_dir=run", *QUIET]  # fmt: skip
    test = ["test", "--ckpt_path", str(data / "run" / "checkpoints" / "best.ckpt"), *QUIET]
    for argv, cwd in ((fit, data), (test, elsewhere)):
        done = subprocess.run([str(SSL_REC), *argv], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        output = done.stdout + done.stderr
        assert "wandb: WARNING" not in output and "deprecated" not in output.lower(), output
        assert "Be aware" not in output and "No seed found" not in output, output
    assert "test_auc" in json.loads((data / "run" / "metrics.json").read_text())
    assert list(elsewhere.iterdir()) == []


def test_each_fit_in_one_process_is_a_run_of_its_own_in_the_group_asked_for(
    tmp_path: Path, write_clicks, capfd: pytest.CaptureFixture
) -> None:
    write_clicks(tmp_path / "clicks.csv", 600, users=30)
    with wandb_group("demo-1"):
        _fit(tmp_path / "clicks.csv", tmp_path / "a", "--trainer.max_steps=1")
        _fit(tmp_path / "clicks.csv", tmp_path / "b", "--trainer.max_steps=1")
    assert GROUP_ENV not in os.environ  # restored
    assert "run already in progress" not in "".join(capfd.readouterr())
    records = [json.loads((tmp_path / name / WANDB_RECORD).read_text()) for name in "ab"]
    assert [r["group"] for r in records] == ["demo-1", "demo-1"]
    assert records[0]["id"] != records[1]["id"]
    for name, record in zip("ab", records, strict=True):
        runs = _offline_runs(tmp_path / name)
        assert len(runs) == 1 and runs[0].endswith(f"-{record['id']}"), runs


def test_predict_writes_beside_the_run_and_refuses_a_second_time(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("wandb", "*_config.yaml"))
    (copy / "predictions.parquet").unlink(missing_ok=True)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    argv = ["predict", "--ckpt_path", str(copy / "checkpoints" / "best.ckpt"), *NO_WANDB, *QUIET]
    main(argv)
    assert (copy / "predictions.parquet").is_file() and (copy / "predict_config.yaml").is_file()
    assert list(cwd.iterdir()) == []
    capsys.readouterr()
    assert exit_code(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{copy / 'predictions.parquet'} already exists" in last and "--overwrite" in last


def test_a_quantized_predict_keeps_an_existing_predictions_file(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    quantized = tmp_path / "quantized"
    main(["quantize", "--ckpt_path", str(run / "checkpoints" / "best.ckpt"), "--out",
          str(quantized), "--budget_ne", "0.01", "--calibration_rows", "64", "--evaluation_rows",
          "64"])  # fmt: skip
    out = tmp_path / "pred.parquet"
    out.write_bytes(b"an earlier result")
    argv = ["predict", "--ckpt_path", str(quantized), "--out", str(out)]
    capsys.readouterr()
    assert exit_code(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{out} already exists; pass --overwrite true" in last, last
    assert out.read_bytes() == b"an earlier result"
    main([*argv, "--overwrite", "true"])
    assert pq.read_table(out).column_names == ["row", "label", "probability"]


def test_a_checkpoint_outside_a_run_directory_gets_its_outputs_beside_it(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loose = tmp_path / "models"
    loose.mkdir()
    shutil.copy(run / "checkpoints" / "best.ckpt", loose / "model.ckpt")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    main(["test", "--ckpt_path", str(loose / "model.ckpt"), *NO_WANDB, *QUIET])
    assert "test_auc" in json.loads((loose / "metrics.json").read_text())
    assert list(cwd.iterdir()) == []


def test_the_run_directory_of_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    ckpt = tmp_path / "run" / "checkpoints" / "best.ckpt"
    assert checkpoint_run_dir(ckpt) == tmp_path / "run" / "checkpoints"  # no fit config there
    (tmp_path / "run" / "config.yaml").write_text("trainer: {}\n")
    assert checkpoint_run_dir(ckpt) == tmp_path / "run"
    assert checkpoint_run_dir(tmp_path / "x" / "model.ckpt") == tmp_path / "x"


def _wandb_config(root: Path, **init_args: object) -> Namespace:
    logger = Namespace(class_path="pytorch_lightning.loggers.WandbLogger",
                       init_args=Namespace(project="ssl-rec", **init_args))  # fmt: skip
    return Namespace(trainer=Namespace(default_root_dir=str(root), logger=logger), ckpt_path=None)


def test_the_users_wandb_settings_are_kept_and_a_test_without_record_joins_a_group(
    tmp_path: Path,
) -> None:
    fit = _wandb_config(tmp_path / "mine", id="given123", name="named")
    set_wandb_run("fit", fit)
    assert (fit.trainer.logger.init_args.id, fit.trainer.logger.init_args.name) == (
        "given123", "named")  # fmt: skip
    assert json.loads((tmp_path / "mine" / WANDB_RECORD).read_text())["id"] == "given123"
    test = _wandb_config(tmp_path / "other")
    set_wandb_run("test", test)
    init = test.trainer.logger.init_args
    assert (init.get("id"), init.group, init.job_type) == (None, "other", "test")
    assert not (tmp_path / "other" / WANDB_RECORD).exists()


def test_a_resumed_fit_continues_its_wandb_run_and_a_fresh_one_starts_a_new_run(
    tmp_path: Path,
) -> None:
    root = tmp_path / "run"
    set_wandb_run("fit", _wandb_config(root))
    first = json.loads((root / WANDB_RECORD).read_text())
    (root / "checkpoints").mkdir()
    (root / "checkpoints" / "last.ckpt").write_bytes(b"")
    resumed = _wandb_config(root)
    resumed.ckpt_path = str(root / "checkpoints" / "last.ckpt")
    set_wandb_run("fit", resumed)
    init = resumed.trainer.logger.init_args
    assert (init.id, init.resume, init.group) == (first["id"], "allow", "run")
    fresh = _wandb_config(root)
    set_wandb_run("fit", fresh)
    assert fresh.trainer.logger.init_args.id != first["id"]
