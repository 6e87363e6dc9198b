"""Exact resume: an interrupted and resumed fit repeats the uninterrupted one step by step."""

from __future__ import annotations

from functools import partial

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from ssl_rec.data import SyntheticConfig, SyntheticCTRDataModule
from ssl_rec.hardware import TableSpec
from ssl_rec.lightning import CTRModule
from ssl_rec.models import Backbone, DLRMEncoder


class StepRecorder(pl.Callback):
    """The loss and the first row ids of every training step."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, float, list[int]]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = float(outputs["loss"])
        self.steps.append((trainer.global_step, loss, batch.row_id[:8].tolist()))


def _setup(tmp_path) -> tuple[SyntheticCTRDataModule, CTRModule]:
    pl.seed_everything(0)
    data = SyntheticCTRDataModule(
        n_train=1200, n_val=400, n_test=64, batch_size=128, cache_dir=str(tmp_path / "cache"),
        synthetic=SyntheticConfig(cardinality_scale=0.0002),
    )  # fmt: skip
    encoder = partial(DLRMEncoder, bottom=(16,), top=(32,))
    tables = TableSpec("int8", cache_fraction=0.2)
    factory = partial(Backbone, embedding_dim=8, tables=tables, encoder=encoder)
    return data, CTRModule(factory, data.schema.to_dict())


def _fit(tmp_path, callbacks, ckpt_path=None, **limits) -> pl.Trainer:
    data, module = _setup(tmp_path)
    trainer = pl.Trainer(
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, callbacks=callbacks, default_root_dir=tmp_path, **limits,
    )  # fmt: skip
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return trainer


STOPS = {"mid_epoch": ({"max_steps": 5}, {"every_n_train_steps": 5}),
         "epoch_end": ({"max_epochs": 1}, {"every_n_epochs": 1})}  # fmt: skip


@pytest.mark.parametrize("stop", sorted(STOPS))
def test_resumed_fit_repeats_the_uninterrupted_one(tmp_path, stop) -> None:
    limits, every = STOPS[stop]
    full = StepRecorder()
    uninterrupted = _fit(tmp_path, [full], max_epochs=3, enable_checkpointing=False)
    first, second = StepRecorder(), StepRecorder()
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, **every)
    _fit(tmp_path, [first, saver], **limits)  # interrupted: its last checkpoint is kept
    resumed = _fit(tmp_path, [second], tmp_path / "ckpt" / "last.ckpt", max_epochs=3,
                   enable_checkpointing=False)  # fmt: skip
    steps = first.steps + second.steps
    assert [s[0] for s in steps] == [s[0] for s in full.steps]
    assert [s[2] for s in steps] == [s[2] for s in full.steps]  # same shuffle, same position
    torch.testing.assert_close([s[1] for s in steps], [s[1] for s in full.steps], rtol=0, atol=1e-6)
    auc = float(uninterrupted.callback_metrics["val/auc"])
    assert abs(float(resumed.callback_metrics["val/auc"]) - auc) <= 1e-6
