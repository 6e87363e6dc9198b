"""Lightning callbacks shipped with ssl-rec."""

from __future__ import annotations

import math
from pathlib import Path

import pytorch_lightning as pl

from ssl_rec._io import atomic_write_json


class MetricsJSON(pl.Callback):
    """Write the test metrics as ``metrics.json`` in the trainer's ``default_root_dir``.

    Keys are the logged names with ``/`` replaced by ``_`` (``test/auc`` -> ``test_auc``);
    when the data module knows oracle metrics (synthetic data) they are added as
    ``oracle_test_auc`` and ``oracle_test_logloss``.
    """

    def __init__(self, filename: str = "metrics.json") -> None:
        super().__init__()
        self.filename = filename

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Collect ``trainer.callback_metrics`` and write them atomically."""
        if trainer.global_rank != 0:
            return
        metrics = {
            k.replace("/", "_"): float(v)
            for k, v in trainer.callback_metrics.items()
            if k.startswith("test/")
        }
        datamodule = trainer.datamodule
        oracle = getattr(datamodule, "oracle_metrics", None)
        if callable(oracle):
            for name, value in (oracle("test") or {}).items():
                metrics[f"oracle_test_{name}"] = float(value)
        metrics = {
            k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()
        }
        atomic_write_json(Path(trainer.default_root_dir) / self.filename, metrics)
