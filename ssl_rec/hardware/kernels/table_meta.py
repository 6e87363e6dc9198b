"""Per-table metadata shared by the reference and compiled kernels.

Every kernel receives the tables as parallel lists (store, cache rows, cache tags, ...) and
one ``int64[T, 10]`` metadata matrix whose columns are named here, so both implementations
read the same layout.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

META_KIND = 0
META_POLICY = 1
META_OPTIMIZER = 2
META_STOCHASTIC = 3
META_STREAM = 4
META_ROW_OFFSET = 5
META_ROWS = 6
META_DIM = 7
META_ROW_STRIDE = 8  # global row = row_offset + local row * row_stride
META_ADMISSION = 9  # a missed row is admitted at this many samples in its batch (>= 1)
META_COLUMNS = 10
HPARAM_LR = 0
HPARAM_EPS = 1
HPARAM_WEIGHT_DECAY = 2  # L2 on the rows a batch touches (FBGEMM's weight_decay_mode L2)
HPARAM_COLUMNS = 3
MAX_ADMISSION = 1 << 30  # samples of a row in a batch are counted in int32

POLICY_CODES: dict[str, int] = {"lru": 0, "lfu": 1}
OPTIMIZER_CODES: dict[str, int] = {"sgd": 0, "rowwise_adagrad": 1}
CACHE_WAYS = 8
EMPTY_TAG = -1
LFU_MAX = 255

__all__ = ["CACHE_WAYS", "AdmittedBatch", "TableTensors", "uncached_tables"]


class TableTensors(NamedTuple):
    """The tensors of a batch of tables, as passed to every kernel.

    Attributes:
        stores: T tensors, uint8[R, row_bytes] fused rows or float[R, D].
        cache_rows: T float32[C, D] cache rows (C = 0 without cache).
        cache_tags: T int16[S, W] row quotients ``row // S`` (-1 = empty slot).
        cache_state: T uint8 tensors: [S, 1] pseudo-LRU tree bits or [S, W] LFU counters.
        stats: T int64[4]: hits, misses, evictions, store writes.
        momentum: T float32[R] row-wise Adagrad state (or [0] for SGD).
        meta: int64[T, 10], columns ``META_*``.
        hparams: float32[T, 3], columns ``HPARAM_*``: learning rate, eps, weight decay.

    """

    stores: list[torch.Tensor]
    cache_rows: list[torch.Tensor]
    cache_tags: list[torch.Tensor]
    cache_state: list[torch.Tensor]
    stats: list[torch.Tensor]
    momentum: list[torch.Tensor]
    meta: torch.Tensor
    hparams: torch.Tensor


class AdmittedBatch(NamedTuple):
    """An admitted batch: what ``admit`` decided, read by ``gather`` and ``update``.

    Attributes:
        rows: int64[T, B]: row t holds table t's ``num_unique[t]`` unique ids first, in
            first-occurrence order.
        num_unique: int64[T] unique ids per table.
        inverse: int32[T, B]: index of each sample's id among its table's unique ids (table-
            major, as ``rows``: each table's column is contiguous for the kernels).
        slots: int32[T, B]: cache slot each unique id got (-1: uncached for this batch).

    """

    rows: torch.Tensor
    num_unique: torch.Tensor
    inverse: torch.Tensor
    slots: torch.Tensor


def uncached_tables(stores: list[torch.Tensor], codes: list[int], dim: int) -> TableTensors:
    """Inference tables without cache or optimizer state: ``stores[t]`` in format ``codes[t]``.

    Args:
        stores: T contiguous stores, ``uint8[R_t, row_bytes]`` or ``float[R_t, D]``.
        codes: T ``Precision.code`` values.
        dim: ``D``.

    """
    t = len(stores)
    meta = torch.zeros(t, META_COLUMNS, dtype=torch.int64)
    meta[:, META_KIND] = torch.tensor(codes, dtype=torch.int64)
    meta[:, META_ROWS] = torch.tensor([len(s) for s in stores], dtype=torch.int64)
    meta[:, META_DIM] = dim
    meta[:, META_ROW_STRIDE] = 1
    meta[:, META_ADMISSION] = 1
    return TableTensors(
        stores=list(stores),
        cache_rows=[torch.zeros(0, dim)] * t,
        cache_tags=[torch.zeros(0, CACHE_WAYS, dtype=torch.int16)] * t,
        cache_state=[torch.zeros(0, 1, dtype=torch.uint8)] * t,
        stats=[torch.zeros(4, dtype=torch.int64) for _ in range(t)],
        momentum=[torch.zeros(0)] * t,
        meta=meta,
        hparams=torch.zeros(t, HPARAM_COLUMNS),
    )
