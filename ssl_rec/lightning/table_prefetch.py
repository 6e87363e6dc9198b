"""``TablePrefetch``: the next batch's cache admissions overlap the current step.

At the start of each training batch this callback reads the next batch one step ahead
(as Lightning's own fetcher does for loaders without a length) and hands its ids to the
backbone, whose tables admit them on a helper thread right after the current batch's own
admission, while the dense layers run (TorchRec's prefetch pipeline for FBGEMM's cache). Results are
bit-identical to admitting at the same point inline; when the next forward looks up other
ids (views that rewrite ids), the admission is wasted, so the callback stops prefetching.
On sharded tables the same call starts the next batch's input dist (the ids' all-to-all)
during the current step instead (``ShardedTablesStrategy(pipeline=True)`` adds this
callback), with the results of the unpipelined step.

A checkpoint written at a step's end (``last.ckpt`` inside an epoch, Ctrl-C) is saved as
the uninterrupted run stands: the loader position excludes the batch read ahead, so the
resumed run reads it again, and the callback's state holds that batch's admission (ids and
plan), which the resumed forward uses instead of admitting the rows a second time.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.loops.fetchers import _DataFetcher, _PrefetchDataFetcher

from ssl_rec.hardware.prefetch import AdmissionQueue
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


def _admission_queue(pl_module: pl.LightningModule) -> AdmissionQueue | None:
    """The admission queue of the module's single-process tables (``None``: none such)."""
    tables = getattr(getattr(pl_module.backbone, "embedding", None), "tables", None)
    queue = getattr(getattr(tables, "group", None), "queue", None)
    return queue if isinstance(queue, AdmissionQueue) else None


def _discard_counter(pl_module: pl.LightningModule) -> Any:
    """The counter of unused prefetches (``.discarded``): admission queue or sharded input dists."""
    tables = getattr(getattr(pl_module.backbone, "embedding", None), "tables", None)
    return _admission_queue(pl_module) or getattr(tables, "ahead", None)


class TablePrefetch(pl.Callback):
    """Admit the next batch's rows into the embedding caches during the current step.

    Args:
        background: Run the admission on a helper thread (``False``: inline, same results).

    """

    def __init__(self, background: bool = True) -> None:
        self.background = background
        self.enabled = True
        self._discarded = 0.0
        self._restore: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        """Nothing of its own (the admission ahead is added by :meth:`on_save_checkpoint`)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep a checkpoint's admission ahead for the resumed run's first step."""
        self._restore = state_dict.get("ahead")

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Save the position of the last batch trained, and the next one's admission."""
        fetcher = getattr(trainer.fit_loop, "_data_fetcher", None)
        held = len(fetcher.batches) if isinstance(fetcher, _PrefetchDataFetcher) else 0
        loop_state = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {})
        for state in loop_state.get("combined_loader", []) if held else []:
            if isinstance(state, dict) and isinstance(state.get("batches"), int):
                state["batches"] = max(0, state["batches"] - held)  # read ahead, not trained
        queue = _admission_queue(pl_module)
        ahead = None if queue is None else queue.ahead_state()
        if ahead is not None:
            checkpoint.setdefault("callbacks", {})[self.state_key] = {"ahead": ahead}

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Schedule the next batch's admission (after this batch's own one)."""
        backbone = pl_module.backbone
        queue = _admission_queue(pl_module)
        if self._restore is not None:
            if queue is not None:
                queue.restore_ahead(self._restore)
            self._restore = None
        # The queue's own counter: the full cache stats read every table's counters (a host
        # sync per table on a GPU) on every step.
        counter = _discard_counter(pl_module)
        if counter is not None:
            discarded = float(counter.discarded)
        else:
            discarded = backbone.table_stats()["cache"].get("prefetch_discarded", 0.0)
        if discarded > self._discarded:
            self.enabled = False  # the forwards look up other ids than the batch's
        self._discarded = discarded
        nxt = next_batch(trainer) if self.enabled else None
        backbone.prefetch_tables(None if nxt is None else nxt.sparse, self.background)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Nothing stays scheduled across epochs."""
        pl_module.backbone.prefetch_tables(None)
