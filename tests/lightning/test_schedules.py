"""Schedules that fit the data: ``batch_size: auto`` and training until validation stalls."""

from __future__ import annotations

import importlib
import inspect
import math
import re
from pathlib import Path

import pytest
import torch
import yaml

from ssl_rec.cli import main
from ssl_rec.cli import run as cli_run
from ssl_rec.data import TabularDataModule
from ssl_rec.data.batch_rule import (
    AUTO_EVAL_BATCH_SIZE,
    AUTO_MAX_BATCH,
    AUTO_MIN_BATCH,
    auto_batch_size,
)

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ["--data.label=clicked", "--data.dense=[price]", "--data.categorical=[user,item]"]
QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false"]  # fmt: skip
# Updates far below float32 resolution: the weights, hence the validation AUC, never change.
FROZEN = ["--model.init_args.learning_rate=1e-12", "--model.init_args.embedding_lr=1e-12"]


def _fit_tabular(csv: Path, tmp_path: Path, *extra: str) -> list[str]:
    return ["fit", "--config", "configs/ctr/tabular.yaml", f"--data.path={csv}", *COLUMNS,
            f"--data.init_args.cache_dir={tmp_path / 'cache'}",
            f"--trainer.default_root_dir={tmp_path / 'run'}", *QUIET, *extra]  # fmt: skip


def test_auto_batch_size_keeps_about_64_steps_per_epoch_within_bounds() -> None:
    assert auto_batch_size(5_000) == 64  # a small labeled table: ~78 steps per epoch
    assert auto_batch_size(3_000) == 64
    assert auto_batch_size(100) == AUTO_MIN_BATCH == 64  # never below the minimum
    assert auto_batch_size(20_000) == 256
    assert auto_batch_size(5_000_000) == AUTO_MAX_BATCH == 4096
    sizes = [auto_batch_size(n) for n in range(1, 400_000, 997)]
    assert sizes == sorted(sizes)  # more rows never give a smaller batch
    assert all(b & (b - 1) == 0 for b in sizes)  # powers of two
    for n in (8_000, 50_000, 200_000):
        assert 64 / math.sqrt(2) <= n / auto_batch_size(n) <= 64 * math.sqrt(2)


def test_auto_batch_size_follows_the_rows_trained_on(tmp_path: Path, write_clicks) -> None:
    csv = tmp_path / "clicks.csv"
    write_clicks(csv, n=25_000)

    def module(**kwargs) -> TabularDataModule:
        return TabularDataModule(str(csv), "clicked", ["price"], ["user", "item"],
                                 batch_size="auto", cache_dir=str(tmp_path / "cache"),
                                 **kwargs)  # fmt: skip

    full = module()
    assert full.train_dataloader().batch_size == auto_batch_size(full.split_table("train").num_rows)
    assert full.train_dataloader().batch_size == 256  # ~20k training rows
    assert full.eval_batch_size == AUTO_EVAL_BATCH_SIZE
    assert full.val_dataloader().batch_size == AUTO_EVAL_BATCH_SIZE
    tenth = module(label_fraction=0.1)  # ~2k labeled rows
    assert tenth.train_dataloader().batch_size == 64
    # Pretraining trains on every row whatever the label fraction.
    unlabeled = module(label_fraction=0.1, use_labels=False)
    assert unlabeled.train_dataloader().batch_size == 256
    # A given evaluation batch is kept.
    assert module(eval_batch_size=100).val_dataloader().batch_size == 100


def test_auto_batch_size_through_the_cli_is_logged_with_its_steps(
    tmp_path: Path, write_clicks, capsys
) -> None:
    csv = tmp_path / "clicks.csv"
    write_clicks(csv, n=600)
    cli = cli_run(_fit_tabular(csv, tmp_path, "--trainer.max_epochs=1"))
    err = capsys.readouterr().err
    found = re.search(r"batch_size auto: (\d+) for (\d+) training rows \((\d+) batches", err)
    assert found, err
    size, rows, batches = map(int, found.groups())
    assert rows == cli.datamodule.split_table("train").num_rows
    assert size == auto_batch_size(rows) == cli.trainer.train_dataloader.batch_size
    assert batches == math.ceil(rows / size) == cli.trainer.global_step
    assert f"training at batch size {size}: {batches} optimizer steps per epoch" in err
    assert f"training stopped after {batches} optimizer steps (1 epochs): max_epochs=1" in err


def test_early_stopping_ends_a_stalled_fit_and_a_resume_trains_nothing(
    tmp_path: Path, write_clicks, capsys
) -> None:
    csv = tmp_path / "clicks.csv"
    write_clicks(csv, n=400)
    argv = _fit_tabular(csv, tmp_path, "--trainer.max_epochs=20", *FROZEN)
    cli = cli_run(argv)
    per_epoch = cli.trainer.num_training_batches
    # patience 3 (configs/common/callbacks/early_stopping.yaml): epoch 0 sets the best,
    # epochs 1-3 do not improve it.
    assert cli.trainer.current_epoch == 4 and cli.trainer.global_step == 4 * per_epoch
    err = capsys.readouterr().err
    assert "(4 epochs): val/auc did not improve for 3 validations" in err
    checkpoints = tmp_path / "run" / "checkpoints"
    load = lambda name: torch.load(checkpoints / name, weights_only=False, map_location="cpu")  # noqa: E731
    assert load("best.ckpt")["epoch"] == 0  # the best epoch, not the last one
    assert load("last.ckpt")["epoch"] == 3

    resumed = cli_run([*argv, "--ckpt_path=last"])
    assert resumed.trainer.global_step == 4 * per_epoch
    assert "nothing left to train" in capsys.readouterr().err
    tested = cli_run(["test", *_fit_tabular(csv, tmp_path)[1:], "--ckpt_path=best"])
    assert Path(tested.trainer.ckpt_path) == checkpoints / "best.ckpt"
    assert 0.0 <= float(tested.trainer.callback_metrics["test/auc"]) <= 1.0


@pytest.mark.parametrize("value", ["0", "autox", "-3"])
def test_bad_batch_size_is_one_line_exit_2(
    value: str, tmp_path: Path, write_clicks, capsys
) -> None:
    csv = tmp_path / "clicks.csv"
    write_clicks(csv, n=200)
    with pytest.raises(SystemExit) as exit_info:
        main(_fit_tabular(csv, tmp_path, f"--data.batch_size={value}"))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "ssl-rec: error:" in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert "batch_size" in errors[0] and value in errors[0], errors[0]
    assert err.strip().splitlines()[-1] == errors[0]


def _class(class_path: str) -> type:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _reads_no_user_file(config: Path) -> bool:
    """Whether the config's data module takes no ``path`` (it generates or ships its rows)."""
    data = yaml.safe_load(config.read_text())["data"]
    if isinstance(data, str):
        data = yaml.safe_load((config.parent / data).read_text())
    return "path" not in inspect.signature(_class(data["class_path"])).parameters


NO_FILE_CONFIGS = sorted(
    p.relative_to(ROOT)
    for p in ROOT.glob("configs/*/*.yaml")
    if p.parent.name != "common" and _reads_no_user_file(p)
)


@pytest.mark.parametrize("config", NO_FILE_CONFIGS, ids=str)
def test_a_config_reading_no_user_file_names_the_one_to_use(
    config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config), f"--data.path={tmp_path / 'clicks.csv'}"])
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("ssl-rec: error: --data.path: the config's data module ("), last
    # The fix it names is a data config file or data module class that exists.
    named = re.search(r"--data (\S+) --data\.path FILE", last).group(1)
    if named.endswith(".yaml"):
        named = yaml.safe_load((ROOT / named).read_text())["class_path"]
    assert "path" in inspect.signature(_class(named)).parameters, named
