"""``TablePrefetch``: the next batch's cache admissions overlap the current step.

At the start of each training batch this callback reads the next batch one step ahead
(as Lightning's own fetcher does for loaders without a length) and hands its ids to the
backbone, whose tables admit them on a helper thread right after the current batch's own
admission, while the dense layers run (TorchRec's prefetch pipeline for FBGEMM's cache). Results are
bit-identical to admitting at the same point inline; when the next forward looks up other
ids (views that rewrite ids), the admission is wasted, so the callback stops prefetching.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.loops.fetchers import _DataFetcher, _PrefetchDataFetcher

from ssl_rec.types import Batch

__all__ = ["TablePrefetch"]


def next_batch(trainer: pl.Trainer) -> Batch | None:
    """The batch the next training step will get, fetched now if Lightning has not yet.

    Lightning's fetcher reads one batch ahead only for loaders without a length; for the
    others this reads one ahead the same way (the fetcher then learns the epoch's end from
    the iterator, as for those loaders), so the data order is unchanged.
    """
    fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
    if not isinstance(fetcher, _PrefetchDataFetcher) or fetcher.done:
        return None
    if not fetcher.batches:
        fetcher.length = None
        try:
            fetcher.batches.append(_DataFetcher.__next__(fetcher))
        except StopIteration:
            return None
    item = fetcher.batches[0]
    item = item[0] if isinstance(item, tuple) else item
    return item if isinstance(item, Batch) else None


class TablePrefetch(pl.Callback):
    """Admit the next batch's rows into the embedding caches during the current step.

    Args:
        background: Run the admission on a helper thread (``False``: inline, same results).

    """

    def __init__(self, background: bool = True) -> None:
        self.background = background
        self.enabled = True
        self._discarded = 0.0

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Schedule the next batch's admission (after this batch's own one)."""
        backbone = pl_module.backbone
        discarded = backbone.table_stats()["cache"].get("prefetch_discarded", 0.0)
        if discarded > self._discarded:
            self.enabled = False  # the forwards look up other ids than the batch's
        self._discarded = discarded
        nxt = next_batch(trainer) if self.enabled else None
        backbone.prefetch_tables(None if nxt is None else nxt.sparse, self.background)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Nothing stays scheduled across epochs."""
        pl_module.backbone.prefetch_tables(None)
