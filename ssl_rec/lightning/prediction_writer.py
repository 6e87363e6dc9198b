"""PredictionWriter: ``trainer.predict`` writes one probability per input row to a file."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import BasePredictionWriter

from ssl_rec.evaluation.predictions import key_columns, prediction_format, write_predictions

log = logging.getLogger(__name__)


class PredictionWriter(BasePredictionWriter):
    """Write the predictions of ``trainer.predict`` in input order, keyed by input columns.

    The data module's predict loader yields its ``test`` split in file order; each
    prediction carries its ``row_id``, so the file has one row per input row, in order, in
    the one schema of :mod:`ssl_rec.evaluation.predictions` (a quantized model's
    predictions have the same): ``row``, the ``keys`` columns read back from the input
    (``datamodule.raw_columns``, read before scoring, so a wrong key fails early),
    ``label`` when the input has one, and ``probability``.

    Args:
        out: ``.parquet``, ``.csv`` or ``.tsv`` file; default
            ``<default_root_dir>/predictions.parquet``.
        keys: input columns to copy next to each probability (e.g. ``[user, item]``).

    Example:
        >>> writer = PredictionWriter("pred.csv", keys=["user"])
        >>> writer.out, writer.keys
        ('pred.csv', ['user'])
        >>> trainer = pl.Trainer(callbacks=[writer], logger=False)  # doctest: +SKIP
        >>> trainer.predict(model, datamodule=dm, return_predictions=False)  # doctest: +SKIP

    """

    def __init__(self, out: str | None = None, keys: list[str] | None = None) -> None:
        super().__init__(write_interval="epoch")
        if out is not None:
            prediction_format(out)
        self.out, self.keys = out, list(keys or [])
        self.written: Path | None = None
        self._key_table: Any = None

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Read the key columns before scoring: a key the input lacks stops the run now."""
        self._key_table = None
        if self.keys and trainer.global_rank == 0:
            self._key_table = key_columns(trainer.datamodule, self.keys)

    def write_on_epoch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        predictions: Sequence[Any],
        batch_indices: Sequence[Any],
    ) -> None:
        """Collect the batches' probabilities, order them by row and write the file."""
        if trainer.global_rank != 0:
            return
        outputs = _flatten(predictions)
        if not outputs or "probability" not in outputs[0]:
            raise ValueError(
                f"{type(pl_module).__name__}.predict_step returns no 'probability'; "
                "PredictionWriter writes the predictions of a CTR model"
            )
        probability = _cat(outputs, "probability")
        rows = _cat(outputs, "row_id") if "row_id" in outputs[0] else np.arange(len(probability))
        order = np.argsort(rows, kind="stable")
        if not np.array_equal(rows[order], np.arange(len(rows))):
            raise ValueError(
                f"predictions cover rows {rows.min()}..{rows.max()} with gaps or repeats; "
                "predict over a whole split (no limit_predict_batches)"
            )
        label = _cat(outputs, "label")[order] if "label" in outputs[0] else None
        keys, self._key_table = self._key_table, None
        out = self.out or str(Path(trainer.default_root_dir) / "predictions.parquet")
        self.written = write_predictions(out, probability[order], keys, label)
        log.info("wrote %d predictions to %s", len(order), self.written)


def _flatten(predictions: Sequence[Any]) -> list[dict[str, torch.Tensor]]:
    # One list per predict dataloader when there are several; one dataloader here.
    if predictions and isinstance(predictions[0], list):
        return [p for group in predictions for p in group]
    return list(predictions)


def _cat(outputs: list[dict[str, torch.Tensor]], key: str) -> np.ndarray:
    return torch.cat([o[key].detach().cpu().reshape(-1) for o in outputs]).numpy()
