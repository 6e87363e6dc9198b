"""A sharded run's lifecycle on the ranks: interrupted, resumed, and a save that fails.

    torchrun --nproc_per_node 2 lifecycle.py OUT_DIR

Fits ``STEPS`` steps uninterrupted; fits again, stopping after ``STOP`` steps with a step
checkpoint every ``EVERY`` steps and ``last.ckpt``; resumes from a step checkpoint and from
``last.ckpt`` to ``STEPS`` (saving again after the restore); then saves once more over
``last.ckpt`` and once to a new name while rank 1's writes fail. Prints one RESULT line:
the losses of every fit (rank 0's) and the errors of the failed saves.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import pytorch_lightning as pl
import torch.distributed as dist
from common import finish, report
from pytorch_lightning.callbacks import ModelCheckpoint
from torch.distributed.checkpoint import FileSystemWriter

from ssl_rec.data import SyntheticConfig, SyntheticCTRDataModule
from ssl_rec.hardware import TableSpec
from ssl_rec.lightning import CTRModule, ShardedTablesStrategy
from ssl_rec.models import Backbone, DLRMEncoder

STEPS, STOP, EVERY = 12, 8, 4


class Losses(pl.Callback):
    """``(global_step, loss)`` of every training step."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps.append((int(trainer.global_step), float(outputs["loss"])))


def fit(out: Path, callbacks: list, ckpt_path: Path | None = None, **limits) -> pl.Trainer:
    pl.seed_everything(0)
    data = SyntheticCTRDataModule(n_train=2048, n_val=64, n_test=64, batch_size=64,
                                  cache_dir=str(out / "cache"),
                                  synthetic=SyntheticConfig(cardinality_scale=0.0005))  # fmt: skip
    encoder = partial(DLRMEncoder, bottom=(16,), top=(32,))
    tables = TableSpec("int8", cache_fraction=0.2)
    module = CTRModule(partial(Backbone, embedding_dim=8, tables=tables, encoder=encoder),
                       data.schema.to_dict())  # fmt: skip
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=ShardedTablesStrategy("row_wise"),
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0, callbacks=callbacks,
                         default_root_dir=out, **limits)  # fmt: skip
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return trainer


def saver(directory: Path, every: int) -> ModelCheckpoint:
    return ModelCheckpoint(dirpath=directory, every_n_train_steps=every, save_last=True,
                           filename="step{step}", auto_insert_metric_name=False,
                           save_top_k=-1)  # fmt: skip


def failing_save(trainer: pl.Trainer, path: Path) -> str | None:
    """Save with rank 1's DCP writes raising; the error every rank saw (None: it saved)."""
    original = FileSystemWriter.write_data

    def write_data(self, plan, planner):
        if dist.get_rank() == 1:
            raise OSError(28, "No space left on device (injected)")
        return original(self, plan, planner)

    FileSystemWriter.write_data = write_data
    try:
        trainer.save_checkpoint(path)
    except Exception as e:  # noqa: BLE001 - the test checks what it was
        return f"{type(e).__name__}: {e}"
    finally:
        FileSystemWriter.write_data = original
    return None


def main() -> None:
    out = Path(sys.argv[1])
    full, first, from_step, from_last = Losses(), Losses(), Losses(), Losses()
    fit(out, [full], max_steps=STEPS, enable_checkpointing=False)
    fit(out, [first, saver(out / "ckpt", EVERY)], max_steps=STOP)
    fit(out, [from_step], out / "ckpt" / f"step{EVERY}.ckpt", max_steps=STEPS,
        enable_checkpointing=False)  # fmt: skip
    # The first save after a restore used to fail (duplicated flatten key) and leave an empty
    # directory under the checkpoint's name: save every 2 steps from here, into a directory
    # holding what a killed save left (the strategy removes it before the first save).
    if dist.get_rank() == 0:
        (out / "resumed" / ".step6.ckpt.partial").mkdir(parents=True)
    dist.barrier()
    resumed = fit(out, [from_last, saver(out / "resumed", 2)], out / "ckpt" / "last.ckpt",
                  max_steps=STEPS)  # fmt: skip
    report(
        full=full.steps,
        first=first.steps,
        from_step=from_step.steps,
        from_last=from_last.steps,
        over_last=failing_save(resumed, out / "ckpt" / "last.ckpt"),
        new_name=failing_save(resumed, out / "ckpt" / "never.ckpt"),
    )
    finish()


if __name__ == "__main__":
    main()
