"""Exact resume: an interrupted and resumed fit repeats the uninterrupted one step by step."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from ssl_rec.hardware import TableSpec
from ssl_rec.lightning.resume_checkpoint import ResumeCheckpoint


class StepRecorder(pl.Callback):
    """The loss and the first row ids of every training step."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, float, list[int]]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = float(outputs["loss"])
        self.steps.append((trainer.global_step, loss, batch.row_id[:8].tolist()))


STOPS = {"mid_epoch": ({"max_steps": 5}, {"every_n_train_steps": 5}),
         "epoch_end": ({"max_epochs": 1}, {"every_n_epochs": 1})}  # fmt: skip


@pytest.mark.parametrize("stop", sorted(STOPS))
def test_resumed_fit_repeats_the_uninterrupted_one(tmp_path, stop, fit_synthetic_ctr) -> None:
    limits, every = STOPS[stop]
    tables = TableSpec("int8", cache_fraction=0.2)

    def _fit(callbacks, ckpt_path=None, **trainer_args) -> pl.Trainer:
        trainer, _ = fit_synthetic_ctr(tmp_path, callbacks, n_train=1200, n_val=400, tables=tables,
                                       hidden=16, ckpt_path=ckpt_path, **trainer_args)  # fmt: skip
        return trainer

    full = StepRecorder()
    uninterrupted = _fit([full], max_epochs=3, enable_checkpointing=False)
    first, second = StepRecorder(), StepRecorder()
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, **every)
    _fit([first, saver], **limits)  # interrupted: its last checkpoint is kept
    resumed = _fit([second], tmp_path / "ckpt" / "last.ckpt", max_epochs=3,
                   enable_checkpointing=False)  # fmt: skip
    steps = first.steps + second.steps
    assert [s[0] for s in steps] == [s[0] for s in full.steps]
    assert [s[2] for s in steps] == [s[2] for s in full.steps]  # same shuffle, same position
    torch.testing.assert_close([s[1] for s in steps], [s[1] for s in full.steps], rtol=0, atol=1e-6)
    auc = float(uninterrupted.callback_metrics["val/auc"])
    assert abs(float(resumed.callback_metrics["val/auc"]) - auc) <= 1e-6


RESUMED_LIMITS = {"max_steps": {"max_steps": 12}, "max_epochs": {"max_epochs": 3}}


@pytest.mark.parametrize("resumed_with", sorted(RESUMED_LIMITS))
def test_a_fit_stopped_by_max_steps_inside_an_epoch_resumes_inside_it(
    tmp_path, resumed_with, fit_synthetic_ctr
) -> None:
    """The ``last.ckpt`` of the epoch end Lightning runs at a ``max_steps`` stop inside an
    epoch resumes that epoch's remaining batches: the split fit is the uninterrupted one."""

    def _fit(callbacks, ckpt_path=None, **trainer_args) -> pl.LightningModule:
        _, module = fit_synthetic_ctr(tmp_path, callbacks, n_train=640, n_val=128,
                                      tables=TableSpec("fp32"), hidden=8, ckpt_path=ckpt_path,
                                      **trainer_args)  # fmt: skip
        return module

    def _saver(name: str) -> ResumeCheckpoint:
        # No interval write: last.ckpt comes only from the epoch end, as in a short real run.
        return ResumeCheckpoint(dirpath=tmp_path / name, save_last=True, last_interval=None)

    limit = RESUMED_LIMITS[resumed_with]
    full = StepRecorder()
    whole = _fit([full], enable_checkpointing=False, **limit)  # 5 steps an epoch
    first, second = StepRecorder(), StepRecorder()
    _fit([first, _saver("stopped")], max_steps=3)
    last = tmp_path / "stopped" / "last.ckpt"
    loops = torch.load(last, weights_only=True)["loops"]["fit_loop"]
    assert loops["epoch_progress"]["total"]["processed"] == 0  # saved as unfinished
    assert loops["state_dict"]["combined_loader"][0]["batches"] == 3
    resumed = _fit([second, _saver("resumed")], last, **limit)
    steps = first.steps + second.steps
    assert [s[0] for s in steps] == [s[0] for s in full.steps]
    assert [s[2] for s in steps] == [s[2] for s in full.steps]  # same shuffle, same position
    assert [s[1] for s in steps] == [s[1] for s in full.steps]
    ours, theirs = whole.state_dict(), resumed.state_dict()
    assert sorted(ours) == sorted(theirs)
    for key, value in ours.items():
        same = torch.equal(value, theirs[key]) if torch.is_tensor(value) else value == theirs[key]
        assert same, key
