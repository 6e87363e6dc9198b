"""Exact resume: an interrupted and resumed fit repeats the uninterrupted one step by step."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from ssl_rec.hardware import TableSpec


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
