"""``AheadProbe``: a callback printing the sharded tables' pipelined input dists at a fit's end.

    --trainer.callbacks+=tests.distributed.workers.ahead_probe.AheadProbe

Prints ``AHEAD {"rank": r, "used": u, "discarded": d}`` on every rank.
"""

from __future__ import annotations

import json

import pytorch_lightning as pl


class AheadProbe(pl.Callback):
    """Print how many input dists started ahead the fit's forwards used or discarded."""

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """One ``AHEAD`` line per rank."""
        ahead = pl_module.backbone.embedding.tables.ahead
        counts = {"rank": trainer.global_rank, "used": ahead.used, "discarded": ahead.discarded}
        print("AHEAD " + json.dumps(counts), flush=True)
