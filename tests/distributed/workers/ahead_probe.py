"""``AheadProbe``: a callback recording the sharded tables' pipelined input dists at a fit's end.

    --trainer.callbacks+=tests.distributed.workers.ahead_probe.AheadProbe

Writes ``ahead_rank<r>.json`` (``{"rank": r, "used": u, "discarded": d}``) into the trainer's
``default_root_dir`` on every rank: one file per rank, since the ranks' printed lines can
interleave on the launcher's shared stdout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytorch_lightning as pl


class AheadProbe(pl.Callback):
    """Record how many input dists started ahead the fit's forwards used or discarded."""

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """One ``ahead_rank<r>.json`` per rank."""
        ahead = pl_module.backbone.embedding.tables.ahead
        counts = {"rank": trainer.global_rank, "used": ahead.used, "discarded": ahead.discarded}
        path = Path(trainer.default_root_dir) / f"ahead_rank{trainer.global_rank}.json"
        path.write_text(json.dumps(counts))
