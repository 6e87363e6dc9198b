"""Resume inside an epoch: a fit stopped by Ctrl-C or SIGKILL at a random step of its first
epoch and resumed with ``fit --ckpt_path last`` ends with the uninterrupted run's weights, bit
for bit (FP32 tables, and INT8 tables with a 5% FP32 cache); ``--ckpt_path last`` without a
``last.ckpt`` is one line; ``best.ckpt`` is the checkpoint of the best validation AUC."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import yaml
from tiny_ctr_config import write_tiny_ctr_config
from torch import nn

from ssl_rec.cli import main
from ssl_rec.cli import run as cli_run
from ssl_rec.lightning.resume_checkpoint import ResumeCheckpoint

ROOT = Path(__file__).resolve().parents[2]
SSL_REC = Path(sys.executable).with_name("ssl-rec")
STEPS_PER_EPOCH = 12  # 768 training rows in batches of 64
EPOCHS = 2
INT8_CACHE5 = ROOT / "configs/common/tables/int8_cache5.yaml"
TABLES = {"fp32": [], "int8_cache5": [f"--model.init_args.backbone.init_args.tables={INT8_CACHE5}"]}


class SignalAtStep(pl.Callback):
    """Sends this process ``signum`` at the end of training step ``step`` (as a user would)."""

    def __init__(self, step: int, signum: int) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


def _config(directory: Path, cache: Path) -> Path:
    """A tiny CTR fit (2 epochs of 12 steps, validation each epoch), the shipped callback."""
    trainer = {"max_epochs": EPOCHS,
               "callbacks": [str(ROOT / "configs/common/callbacks/best_val_auc.yaml")]}  # fmt: skip
    data = {"n_train": 64 * STEPS_PER_EPOCH, "n_val": 256, "n_test": 128, "batch_size": 64,
            "cache_dir": str(cache), "synthetic": {"cardinality_scale": 0.0005}}  # fmt: skip
    return write_tiny_ctr_config(directory, trainer, data)


def _fit(config: Path, root: Path, tables: str, *extra: str) -> list[str]:
    """``ssl-rec fit`` of ``config`` into ``root``, ``last.ckpt`` written after every step."""
    return ["fit", "--config", str(config), f"--trainer.default_root_dir={root}",
            "--trainer.callbacks.init_args.last_interval=0:00:00", *TABLES[tables],
            *extra]  # fmt: skip


def _stop_at(step: int, signum: int) -> list[str]:
    init_args = {"step": step, "signum": int(signum)}
    callback = {"class_path": f"{__name__}.SignalAtStep", "init_args": init_args}
    return [f"--trainer.callbacks+={yaml.safe_dump(callback, default_flow_style=True).strip()}"]


def _state(path: Path) -> dict[str, object]:
    """Weights (tables, caches, rounding counters) and optimizer states of a checkpoint."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    state = {f"weights/{k}": v for k, v in checkpoint["state_dict"].items()}
    for i, optimizer in enumerate(checkpoint["optimizer_states"]):
        for key, value in optimizer["state"].items():
            for name, tensor in value.items():
                state[f"optimizer{i}/{key}/{name}"] = tensor
    return state


def _assert_identical(resumed: Path, uninterrupted: Path) -> None:
    a, b = _state(resumed), _state(uninterrupted)
    assert sorted(a) == sorted(b)
    differ = [k for k in a if not (torch.equal(a[k], b[k]) if torch.is_tensor(a[k])
                                   else a[k] == b[k])]  # fmt: skip
    assert not differ, f"{len(differ)} tensors differ, e.g. {differ[:5]}"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("mid_epoch")
    return {"base": base, "config": _config(base, base / "cache")}


@pytest.fixture(scope="module")
def uninterrupted(work: dict[str, Path]) -> dict[str, Path]:
    """``last.ckpt`` of an uninterrupted fit for each table format."""
    done = {}
    for tables in TABLES:
        root = work["base"] / f"uninterrupted_{tables}"
        main(_fit(work["config"], root, tables))
        done[tables] = root / "checkpoints" / "last.ckpt"
        assert torch.load(done[tables], weights_only=True)["global_step"] == 24
    return done


@pytest.mark.parametrize("tables", sorted(TABLES))
def test_ctrl_c_in_the_first_epoch_then_resume_ends_with_the_same_weights(
    tables: str, work: dict[str, Path], uninterrupted: dict[str, Path], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    step = random.Random(f"sigint-{tables}").randint(1, STEPS_PER_EPOCH - 1)
    root = tmp_path / "run"
    last = root / "checkpoints" / "last.ckpt"
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite runs in the background
    with pytest.raises(SystemExit) as stopped:  # Lightning's exit on KeyboardInterrupt
        main(_fit(work["config"], root, tables, *_stop_at(step, signal.SIGINT)))
    assert stopped.value.code == 1
    assert signal.getsignal(signal.SIGINT) is before  # given back
    err = capsys.readouterr().err
    assert (
        f"ssl-rec: interrupted; saved {last} at step {step}: continue with --ckpt_path last" in err
    )
    saved = torch.load(last, weights_only=True)
    assert (saved["epoch"], saved["global_step"]) == (0, step), f"stopped at step {step}"
    main(_fit(work["config"], root, tables, "--ckpt_path", "last"))
    assert torch.load(last, weights_only=True)["global_step"] == EPOCHS * STEPS_PER_EPOCH
    _assert_identical(last, uninterrupted[tables])


def test_sigkill_in_the_first_epoch_then_resume_from_the_interval_checkpoint(
    work: dict[str, Path], uninterrupted: dict[str, Path], tmp_path: Path
) -> None:
    """A killed process saves nothing: the step-interval ``last.ckpt`` before it is resumed."""
    tables = "int8_cache5"
    step = random.Random("sigkill").randint(2, STEPS_PER_EPOCH - 1)
    root = tmp_path / "run"
    last = root / "checkpoints" / "last.ckpt"
    env = {**os.environ, "OMP_NUM_THREADS": "1",  # the reference ran on one thread
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(ROOT)])}  # fmt: skip
    killed = subprocess.run(
        [str(SSL_REC), *_fit(work["config"], root, tables, *_stop_at(step, signal.SIGKILL))],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    saved = torch.load(last, weights_only=True)
    # the kill came before the step's own interval write: the previous step's is resumed
    assert (saved["epoch"], saved["global_step"]) == (0, step - 1)
    main(_fit(work["config"], root, tables, "--ckpt_path", "last"))
    _assert_identical(last, uninterrupted[tables])


def test_resume_without_last_checkpoint_is_one_line(
    work: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(_fit(work["config"], root, "fp32", "--ckpt_path", "last"))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1] == (
        f"ssl-rec: error: no last.ckpt in {root / 'checkpoints'}: the run saved none yet; "
        "start it again without --ckpt_path (--debug shows the traceback)"
    )
    assert "Traceback" not in err and "HINT" not in err
    assert not (root / "checkpoints" / "last.ckpt").exists()  # nothing was trained


def test_best_ckpt_is_the_best_validation_auc_and_test_finds_it(
    work: dict[str, Path], uninterrupted: dict[str, Path]
) -> None:
    directory = uninterrupted["fp32"].parent
    assert sorted(p.name for p in directory.glob("*.ckpt")) == ["best.ckpt", "last.ckpt"]
    best = torch.load(directory / "best.ckpt", weights_only=True)
    (state,) = [v for k, v in best["callbacks"].items() if k.startswith("ResumeCheckpoint")]
    score = float(state["best_model_score"])
    root = directory.parent
    tested = cli_run(["validate", "--config", str(work["config"]), "--ckpt_path", "best",
                      f"--trainer.default_root_dir={root}"])  # fmt: skip
    assert tested.trainer.ckpt_path == str(directory / "best.ckpt")
    assert float(tested.trainer.callback_metrics["val/auc"]) == pytest.approx(score, abs=1e-6)


def test_ckpt_path_best_without_best_ckpt_is_one_line(
    work: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "run" / "checkpoints"
    with pytest.raises(SystemExit) as exit_info:
        main(["test", "--config", str(work["config"]), "--ckpt_path", "best",
              f"--trainer.default_root_dir={tmp_path / 'run'}"])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if line.strip()][-1] == (
        f"ssl-rec: error: no best.ckpt in {directory} (best.ckpt is written at the end of an "
        "epoch with validation); give a checkpoint file with --ckpt_path (--debug shows the "
        "traceback)"
    )


@pytest.mark.parametrize("command", ["test", "predict", "export"])
def test_ckpt_help_says_which_file_is_the_best_model(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    # the option's own help (export's option is --ckpt_path or, before, --ckpt), not the usage
    helps = re.findall(r"--ckpt(?:_path)? CKPT(?:_PATH)? ([^\[\]]{0,400})", text)
    assert any("best.ckpt" in h and "best validation AUC" in h for h in helps), helps


class _ScriptedAUC(pl.LightningModule):
    """Logs ``val/auc`` from a script, one value per epoch (no data, no model to speak of)."""

    def __init__(self, aucs: list[float]) -> None:
        super().__init__()
        self.aucs = aucs
        self.layer = nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).sum()

    def validation_step(self, batch, batch_idx) -> None:
        self.log("val/auc", self.aucs[self.current_epoch])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.ones(8, 2), batch_size=2)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(torch.ones(2, 2), batch_size=2)


def test_best_ckpt_keeps_the_best_epoch_while_last_is_written_every_step(tmp_path: Path) -> None:
    """Every-step ``last.ckpt`` writes never make Lightning skip an epoch's best check."""
    aucs = [0.6, 0.8, 0.7]
    callback = ResumeCheckpoint(
        dirpath=tmp_path, monitor="val/auc", mode="max", filename="best", save_top_k=1,
        save_last=True, last_interval=timedelta(0),
        enable_version_counter=False,
    )  # fmt: skip
    trainer = pl.Trainer(max_epochs=3, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=[callback])  # fmt: skip
    trainer.fit(_ScriptedAUC(aucs))
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["best.ckpt", "last.ckpt"]
    best = torch.load(tmp_path / "best.ckpt", weights_only=True)
    last = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert (best["epoch"], best["global_step"]) == (1, 8)  # epoch 1's end: AUC 0.8
    (state,) = best["callbacks"].values()
    assert float(state["best_model_score"]) == pytest.approx(0.8)
    assert (last["epoch"], last["global_step"]) == (2, 12)
    assert trainer.checkpoint_callback.best_model_path == str(tmp_path / "best.ckpt")


class _SignalTwice(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == 2:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # impatient: stops at once, inside this hook


def test_a_second_ctrl_c_stops_at_once_and_keeps_the_previous_last(tmp_path: Path) -> None:
    callback = ResumeCheckpoint(dirpath=tmp_path, save_last=True, last_interval=timedelta(0))
    trainer = pl.Trainer(max_epochs=3, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=[_SignalTwice(), callback])  # fmt: skip
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as stopped:
        trainer.fit(_ScriptedAUC([0.5, 0.5, 0.5]))
    assert stopped.value.code == 1
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 1
    assert signal.getsignal(signal.SIGINT) is before  # given back


PREFETCH = ["--trainer.callbacks+=ssl_rec.lightning.table_prefetch.TablePrefetch"]


def test_ctrl_c_with_table_prefetch_then_resume_ends_with_the_same_weights(
    work: dict[str, Path], tmp_path: Path
) -> None:
    """The batch read and admitted ahead at the stop is trained once, with that admission."""
    tables = "int8_cache5"
    reference = tmp_path / "uninterrupted"
    main(_fit(work["config"], reference, tables, *PREFETCH))
    step = random.Random("sigint-prefetch").randint(1, STEPS_PER_EPOCH - 1)
    root = tmp_path / "run"
    last = root / "checkpoints" / "last.ckpt"
    with pytest.raises(SystemExit):
        main(_fit(work["config"], root, tables, *PREFETCH, *_stop_at(step, signal.SIGINT)))
    saved = torch.load(last, weights_only=True)
    assert saved["global_step"] == step
    (loader,) = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert loader["batches"] == step  # the batch read ahead is not counted as trained
    (prefetch,) = [v for k, v in saved["callbacks"].items() if k.startswith("TablePrefetch")]
    assert prefetch["ahead"]["ids"].shape == (64, 26)  # the next batch's admission
    main(_fit(work["config"], root, tables, *PREFETCH, "--ckpt_path", "last"))
    resumed = torch.load(last, weights_only=True)
    assert resumed["global_step"] == EPOCHS * STEPS_PER_EPOCH
    _assert_identical(last, reference / "checkpoints" / "last.ckpt")


def test_a_fit_stopped_by_max_steps_at_an_epoch_end_resumes_with_the_next_epoch(
    work: dict[str, Path], uninterrupted: dict[str, Path], tmp_path: Path
) -> None:
    """Lightning alone would replay the finished epoch's end, count it twice and stop early."""
    root = tmp_path / "run"
    last = root / "checkpoints" / "last.ckpt"
    main(_fit(work["config"], root, "fp32", f"--trainer.max_steps={STEPS_PER_EPOCH}"))
    saved = torch.load(last, weights_only=True)
    assert saved["global_step"] == STEPS_PER_EPOCH
    assert saved["loops"]["fit_loop"]["epoch_progress"]["total"]["processed"] == 1
    main(_fit(work["config"], root, "fp32", f"--trainer.max_steps={EPOCHS * STEPS_PER_EPOCH}",
              "--ckpt_path", "last"))  # fmt: skip
    resumed = torch.load(last, weights_only=True)
    assert (resumed["epoch"], resumed["global_step"]) == (EPOCHS - 1, EPOCHS * STEPS_PER_EPOCH)
    _assert_identical(last, uninterrupted["fp32"])


def test_a_fit_stopped_by_max_steps_inside_an_epoch_resumes_inside_it(
    work: dict[str, Path], uninterrupted: dict[str, Path], tmp_path: Path
) -> None:
    """The epoch end Lightning runs at the stop writes ``last.ckpt``; the rest of the epoch
    is trained after the resume, not skipped."""
    root = tmp_path / "run"
    last = root / "checkpoints" / "last.ckpt"
    step = random.Random("max_steps").randint(1, STEPS_PER_EPOCH - 1)
    epoch_end_only = "--trainer.callbacks.init_args.last_interval=null"  # no step's last.ckpt
    main(_fit(work["config"], root, "fp32", epoch_end_only, f"--trainer.max_steps={step}"))
    saved = torch.load(last, weights_only=True)
    assert (saved["epoch"], saved["global_step"]) == (0, step)
    assert saved["loops"]["fit_loop"]["epoch_progress"]["total"]["processed"] == 0
    resume = [f"--trainer.max_steps={EPOCHS * STEPS_PER_EPOCH}", "--ckpt_path", "last"]
    main(_fit(work["config"], root, "fp32", epoch_end_only, *resume))
    resumed = torch.load(last, weights_only=True)
    assert (resumed["epoch"], resumed["global_step"]) == (EPOCHS - 1, EPOCHS * STEPS_PER_EPOCH)
    _assert_identical(last, uninterrupted["fp32"])
