"""Semi-supervised training batches: labeled rows plus a fixed number of unlabeled rows.

Each batch of a labeled :class:`BatchLoader` gets ``unlabeled_batch_size`` rows of a second
:class:`BatchLoader` over the unlabeled pool appended, their label NaN: a model computes its
supervised loss on the finite labels and self-supervised losses on every row. The epoch is
the labeled loader's; the unlabeled rows cycle through their own shuffled epochs. Which
unlabeled rows come with labeled batch ``i`` of epoch ``e`` is fixed by the global batch
index ``e * len(labeled) + i``, so a resumed run (Lightning restores the labeled position)
sees the batches an uninterrupted one would, and every rank reads its own shard of both.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import torch

from ssl_rec._checks import check_nonnegative
from ssl_rec.data.loader import BatchLoader, EpochShuffle
from ssl_rec.data.storage import DENSE, SPARSE
from ssl_rec.types import Batch

_UNLABELED_STREAM = 11
log = logging.getLogger(__name__)


def check_unlabeled_per_batch(
    value: float, use_labels: bool, label_fraction: float, unlabeled_file: bool = False
) -> float:
    """Return ``float(value)`` if it is a valid batch mix for these data options.

    Raises:
        ValueError: ``value`` is negative or not finite, or positive while labels are off
            (``use_labels`` false) or every training row is labeled (``label_fraction`` 1)
            and there is no ``unlabeled_file`` of other rows.

    """
    value = check_nonnegative("data", "unlabeled_per_batch", value)
    if value and unlabeled_file and not use_labels:
        raise ValueError(
            f"unlabeled_per_batch={value:g} needs labeled training (use_labels=true); with "
            "use_labels=false the unlabeled file's rows join the training rows instead"
        )
    if value and not unlabeled_file and (not use_labels or label_fraction >= 1.0):
        raise ValueError(
            f"unlabeled_per_batch={value:g} needs labeled training (use_labels=true) on a part "
            f"of the rows (label_fraction < 1, got {label_fraction:g}): the unlabeled rows "
            "are the rest of the training split"
        )
    return value


def unlabeled_features(table: pa.Table) -> pa.Table:
    """The ``dense`` and ``sparse`` columns of a split table (its label, if any, dropped)."""
    return table.select([DENSE, SPARSE])


def with_unlabeled_rest(
    table: pa.Table,
    labeled: np.ndarray,
    loader: BatchLoader,
    unlabeled_per_batch: float,
    extra: pa.Table | None = None,
) -> SemiSupervisedLoader:
    """``loader``'s batches with rows of ``table`` outside ``labeled`` appended (label NaN).

    Args:
        table: the whole training split.
        labeled: sorted ids of the rows ``loader`` reads (the labeled subset).
        loader: the labeled loader.
        unlabeled_per_batch: unlabeled rows per labeled row of a full batch (``> 0``); a
            batch carries ``round(unlabeled_per_batch * B)`` of them, ``B`` the batch size
            or the labeled rows per process if fewer.
        extra: rows of a separate unlabeled file (encoded with the training vocabulary),
            pooled after the rest of the split; their ``row_id`` continues the split's
            (``N_train + i``).

    """
    outside = np.ones(table.num_rows, dtype=bool)
    outside[labeled] = False
    rest = np.flatnonzero(outside)
    # The rest is gathered (BatchLoader reads contiguous slices); the file's rows stay mapped.
    pool = unlabeled_features(table.take(pa.array(rest)))
    if extra is not None:
        pool = pa.concat_tables([pool, unlabeled_features(extra)])
        extra_ids = table.num_rows + np.arange(extra.num_rows, dtype=np.int64)
        rest = np.concatenate([rest, extra_ids])
    # A labeled subset smaller than one batch is one batch: the mix follows its rows.
    labeled_rows = min(loader.batch_size, loader.num_rows)
    size = max(1, round(unlabeled_per_batch * labeled_rows))
    log.info(
        "semi-supervised: %d unlabeled rows (of %d) with each batch of %d labeled rows",
        size, len(rest), labeled_rows,
    )  # fmt: skip
    return SemiSupervisedLoader(loader, pool, rest, size)


class SemiSupervisedLoader:
    """Yields labeled batches with unlabeled rows (label NaN) appended.

    Args:
        labeled: the loader of the labeled training rows; it defines the epoch, the
            shuffle seed and the rank / world sharding.
        unlabeled: the unlabeled pool (``dense`` and ``sparse`` columns; a ``label``
            column is ignored).
        unlabeled_row_ids: ``int64[N_u]`` row id of each pool row in its split (yielded
            as ``Batch.row_id``).
        unlabeled_batch_size: unlabeled rows appended to every batch (``>= 1``).

    Raises:
        ValueError: the pool holds fewer rows per rank than one batch's unlabeled rows.

    Example:
        >>> from ssl_rec.data.storage import record_batch, split_schema
        >>> schema = split_schema(2, 3, True, False)
        >>> def rows(n):
        ...     return pa.Table.from_batches([record_batch(
        ...         schema, np.zeros((n, 2)), np.ones((n, 3)), np.zeros(n))])
        >>> mixed = SemiSupervisedLoader(BatchLoader(rows(8), 4), rows(6), np.arange(6), 2)
        >>> batch = next(iter(mixed))
        >>> batch.batch_size, int(batch.label.isnan().sum())
        (6, 2)

    """

    def __init__(
        self,
        labeled: BatchLoader,
        unlabeled: pa.Table,
        unlabeled_row_ids: np.ndarray,
        unlabeled_batch_size: int,
    ) -> None:
        if unlabeled_batch_size < 1:
            raise ValueError(f"unlabeled_batch_size must be >= 1, got {unlabeled_batch_size}")
        if not labeled.with_labels:
            raise ValueError("SemiSupervisedLoader needs a labeled loader (with_labels=True)")
        seed = int(np.random.SeedSequence([labeled.seed, _UNLABELED_STREAM]).generate_state(1)[0])
        self.labeled = labeled
        self.unlabeled = BatchLoader(
            unlabeled, unlabeled_batch_size, shuffle=True, seed=seed, drop_last=True,
            with_labels=False, row_ids=np.asarray(unlabeled_row_ids, dtype=np.int64),
            block_rows=labeled.block_rows, rank=labeled.rank, world_size=labeled.world_size,
        )  # fmt: skip
        if len(self.unlabeled) == 0:
            raise ValueError(
                f"the unlabeled pool has {self.unlabeled.num_rows} rows per process, fewer "
                f"than the {unlabeled_batch_size} unlabeled rows each batch needs; lower "
                "unlabeled_per_batch or the batch size"
            )
        self.batch_size = labeled.batch_size
        self.unlabeled_batch_size = unlabeled_batch_size
        self.batch_sampler = None  # Lightning reads it beside ``sampler``
        self._resume: tuple[int, int] | None = None  # (epoch, batches) to continue after

    @property
    def sampler(self) -> EpochShuffle:
        """The labeled loader's shuffle order (Lightning calls its ``set_epoch``)."""
        return self.labeled.sampler

    @property
    def epoch(self) -> int:
        """Epoch whose shuffle the next iteration uses."""
        return self.labeled.epoch

    def set_epoch(self, epoch: int) -> None:
        """Use the shuffle of ``epoch`` for the next iteration."""
        self.labeled.set_epoch(epoch)

    def __len__(self) -> int:
        """Batches per epoch: the labeled loader's."""
        return len(self.labeled)

    def state_dict(self) -> dict[str, int]:
        """The labeled loader's position and the unlabeled pool's size and batch size."""
        return {**self.labeled.state_dict(), "unlabeled_rows": self.unlabeled.num_rows,
                "unlabeled_batch_size": self.unlabeled_batch_size}  # fmt: skip

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue where :meth:`state_dict` was taken (the unlabeled position follows).

        Raises:
            ValueError: the state was saved by a loader over other rows, sizes or seed.

        """
        mine = {"unlabeled_rows": self.unlabeled.num_rows,
                "unlabeled_batch_size": self.unlabeled_batch_size}  # fmt: skip
        theirs = {k: state.get(k) for k in mine}
        if theirs != mine:
            raise ValueError(
                f"the checkpoint's loader position is for {theirs}, this loader has {mine}; "
                "resume with the data, label_fraction, unlabeled_per_batch and batch size of "
                "the interrupted run"
            )
        self.labeled.load_state_dict(state)
        self._resume = (int(state["epoch"]), int(state["batches"]))

    def _unlabeled_batches(self, start: int) -> Iterator[Batch]:
        """Unlabeled batches from global batch index ``start`` on, endlessly."""
        per_epoch = len(self.unlabeled)
        state = self.unlabeled.state_dict()
        self.unlabeled.load_state_dict(
            {**state, "epoch": start // per_epoch, "batches": start % per_epoch}
        )
        while True:
            yield from self.unlabeled

    def __iter__(self) -> Iterator[Batch]:
        """One labeled epoch, each batch followed by its unlabeled rows (label NaN)."""
        epoch, skipped = self.labeled.epoch, 0
        if self._resume is not None and self._resume[0] == epoch:
            skipped = self._resume[1]
        self._resume = None
        stream = self._unlabeled_batches(epoch * len(self.labeled) + skipped)
        for batch in self.labeled:
            yield join_unlabeled(batch, next(stream))


def join_unlabeled(labeled: Batch, unlabeled: Batch) -> Batch:
    """``labeled``'s rows followed by ``unlabeled``'s, whose labels become NaN.

    Args:
        labeled: a batch with ``label float[B]``.
        unlabeled: a batch of ``B_u`` rows (its label, if any, is dropped).

    Returns:
        A batch of ``B + B_u`` rows; ``row_id`` is kept when both have one.

    """
    missing = torch.full((unlabeled.batch_size,), float("nan"), dtype=labeled.label.dtype)
    row_id = None
    if labeled.row_id is not None and unlabeled.row_id is not None:
        row_id = torch.cat([labeled.row_id, unlabeled.row_id])
    return Batch(
        dense=torch.cat([labeled.dense, unlabeled.dense]),
        sparse=torch.cat([labeled.sparse, unlabeled.sparse]),
        label=torch.cat([labeled.label, missing.to(labeled.label.device)]),
        row_id=row_id,
    )
