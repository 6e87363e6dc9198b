"""``EpochClock``: a callback that times a fit's training steps and validation passes.

Added to an ``ssl-rec fit`` command line by the benchmarks that time whole epochs
(``--trainer.callbacks+={"class_path": "benchmarks._epoch_clock.EpochClock", ...}``); it
writes its figures as JSON when the fit ends, however it ends (last step, ``max_time``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl

from ssl_rec._io import atomic_write_json

__all__ = ["EpochClock"]


class EpochClock(pl.Callback):
    """Wall-clock seconds of training (first batch to last) and of validation, and steps done.

    Args:
        out: JSON file written at the fit's end: ``train_seconds``, ``train_steps``,
            ``train_samples``, ``val_seconds``, ``val_batches``, ``val_samples``,
            ``steps_per_epoch`` (the loader's length) and ``stopped_early`` (training ended
            before the epoch's last batch, e.g. by ``max_time``).

    """

    def __init__(self, out: str) -> None:
        self.out = out
        self.figures: dict[str, Any] = {"train_seconds": 0.0, "train_steps": 0,
                                        "train_samples": 0, "val_seconds": 0.0,
                                        "val_batches": 0, "val_samples": 0}  # fmt: skip
        self._train_start: float | None = None
        self._val_start = 0.0

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:  # fmt: skip
        """Start the training clock at the first batch (after set-up and sanity checks)."""
        if self._train_start is None:
            self._train_start = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:  # fmt: skip
        """Count the step and its samples; the training time so far, validation excluded."""
        self.figures["train_steps"] += 1
        self.figures["train_samples"] += int(batch.sparse.shape[0])
        elapsed = time.perf_counter() - (self._train_start or time.perf_counter())
        self.figures["train_seconds"] = elapsed - self.figures["val_seconds"]

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start the validation clock (sanity checks are not counted)."""
        self._val_start = time.perf_counter()

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:  # fmt: skip
        """Count a validation batch and its samples."""
        if not trainer.sanity_checking:
            self.figures["val_batches"] += 1
            self.figures["val_samples"] += int(batch.sparse.shape[0])

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Add the pass's time to the validation total."""
        if not trainer.sanity_checking:
            self.figures["val_seconds"] += time.perf_counter() - self._val_start

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Write the figures (``steps_per_epoch`` from the loader, when it has a length)."""
        steps = trainer.num_training_batches
        self.figures["steps_per_epoch"] = None if steps == float("inf") else int(steps)
        self.figures["stopped_early"] = bool(
            self.figures["steps_per_epoch"]
            and self.figures["train_steps"] < self.figures["steps_per_epoch"]
        )
        atomic_write_json(Path(self.out), self.figures)
