"""Pure-torch reference kernels: the oracle every compiled kernel must match.

The arithmetic is written operation by operation in the same order as
``csrc/embedding_ops.cpp`` (sums over samples in sample order, sums over columns in column
order, no fused multiply-add), so the compiled kernels reproduce it bit for bit and
integer stores match exactly. Cache management is inherently sequential and is a Python
loop here: use this module on small batches only.
"""

from __future__ import annotations

import torch

from ssl_rec.hardware.kernels.layout import (
    CACHE_WAYS,
    EMPTY_TAG,
    LFU_MAX,
    META_DIM,
    META_KIND,
    META_OPTIMIZER,
    META_POLICY,
    META_ROW_OFFSET,
    META_ROW_STRIDE,
    META_STOCHASTIC,
    META_STREAM,
    TableTensors,
)
from ssl_rec.hardware.precision import Precision
from ssl_rec.hardware.quantization import dequantize_rows, quantize_rows
from ssl_rec.hardware.stochastic_rounding import (
    PURPOSE_EVICT,
    PURPOSE_UPDATE,
    row_keys,
    stream_key,
)

__all__ = ["bag_lookup", "find_slots", "forward", "train_forward", "update"]


def find_slots(tags: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Cache slot of each row, -1 when not cached.

    Args:
        tags: int16[S, W] cache tags (row quotients).
        rows: int64[n] table-local row ids.

    Returns:
        int64[n] slot indices ``set * W + way`` or -1.

    """
    num_sets = tags.shape[0]
    if num_sets == 0:
        return torch.full_like(rows, -1)
    sets, quot = rows % num_sets, rows // num_sets
    match = tags[sets].to(torch.int64) == quot[:, None]
    way = match.to(torch.int64).argmax(dim=1)
    return torch.where(match.any(dim=1), sets * tags.shape[1] + way, torch.full_like(rows, -1))


def _lookup_table(t: TableTensors, i: int, rows: torch.Tensor) -> torch.Tensor:
    kind, dim = Precision.from_code(int(t.meta[i, META_KIND])), int(t.meta[i, META_DIM])
    values = dequantize_rows(t.stores[i][rows], kind, dim)
    slots = find_slots(t.cache_tags[i], rows)
    hit = slots >= 0
    if hit.any():
        values[hit] = t.cache_rows[i][slots[hit]]
    return values


def forward(t: TableTensors, ids: torch.Tensor) -> torch.Tensor:
    """Cache lookup + dequantize for every table, one id per (sample, table).

    Args:
        t: The tables.
        ids: int64[B, T] table-local row ids (validated by the caller).

    Returns:
        float32[B, T, D].

    """
    cols = [_lookup_table(t, i, ids[:, i]) for i in range(ids.shape[1])]
    return torch.stack(cols, dim=1)


def _plru_touch(bits: int, way: int) -> int:
    node = 0
    for level in range(3):
        right = (way >> (2 - level)) & 1
        bits = (bits & ~(1 << node)) | ((1 - right) << node)
        node = 2 * node + 1 + right
    return bits


def _plru_victim(bits: int) -> int:
    node, way = 0, 0
    for _ in range(3):
        right = (bits >> node) & 1
        way = (way << 1) | right
        node = 2 * node + 1 + right
    return way


def _touch(state: torch.Tensor, policy: int, s: int, way: int, fresh: bool) -> None:
    if policy == 0:
        state[s, 0] = _plru_touch(int(state[s, 0]), way)
        return
    if fresh:
        state[s, way] = 1
        return
    if int(state[s, way]) >= LFU_MAX:
        state[s] = state[s] // 2  # aging keeps counts bounded and lets old favourites go
    state[s, way] += 1


def _victim(tags: torch.Tensor, state: torch.Tensor, policy: int, s: int) -> int:
    empty = (tags[s] == EMPTY_TAG).nonzero()
    if len(empty):
        return int(empty[0])
    if policy == 0:
        return _plru_victim(int(state[s, 0]))
    return int(state[s].to(torch.int64).argmin())


def _admit_table(
    t: TableTensors,
    i: int,
    rows: torch.Tensor,
    seed: int,
    step: int,
    values: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """Admit ``rows`` int64[B] into table ``i``'s cache.

    ``values`` float32[B, D] receives each row's FP32 value right after its admission and
    ``slots`` int32[B] its slot (-1 without cache).
    """
    tags, state, cache = t.cache_tags[i], t.cache_state[i], t.cache_rows[i]
    num_sets = tags.shape[0]
    if num_sets == 0:
        values.copy_(_lookup_table(t, i, rows))
        slots.fill_(-1)
        return
    kind, policy = Precision.from_code(int(t.meta[i, META_KIND])), int(t.meta[i, META_POLICY])
    stochastic, offset = bool(t.meta[i, META_STOCHASTIC]), int(t.meta[i, META_ROW_OFFSET])
    stride = int(t.meta[i, META_ROW_STRIDE])
    key = stream_key(seed, int(t.meta[i, META_STREAM]), PURPOSE_EVICT, step)
    for b, row in enumerate(rows.tolist()):
        s, quot = row % num_sets, row // num_sets
        hits = (tags[s] == quot).nonzero()
        if len(hits):
            t.stats[i][0] += 1
            _touch(state, policy, s, int(hits[0]), fresh=False)
            _record(values, slots, b, cache, s * CACHE_WAYS + int(hits[0]))
            continue
        t.stats[i][1] += 1
        way = _victim(tags, state, policy, s)
        slot = s * CACHE_WAYS + way
        if int(tags[s, way]) != EMPTY_TAG:
            old = int(tags[s, way]) * num_sets + s
            rk = row_keys(key, torch.tensor([offset + old * stride])) if stochastic else None
            t.stores[i][old] = quantize_rows(cache[slot : slot + 1], kind, rk)[0]
            t.stats[i][2] += 1
        cache[slot] = dequantize_rows(t.stores[i][row : row + 1], kind, cache.shape[1])[0]
        tags[s, way] = quot
        _touch(state, policy, s, way, fresh=True)
        _record(values, slots, b, cache, slot)


def _record(values, slots, b: int, cache: torch.Tensor, slot: int) -> None:
    values[b] = cache[slot]
    slots[b] = slot


def train_forward(
    t: TableTensors, ids: torch.Tensor, seed: int, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Training forward: cache admission and :func:`forward` fused into one pass.

    Ids are processed in sample order; a miss takes an empty way, else the pseudo-LRU
    victim (``lru``) or the least-frequent way (``lfu``); the victim's FP32 row is written
    to the store with stochastic rounding (purpose ``PURPOSE_EVICT``).

    Each output is the row's FP32 value right after its admission (a row evicted again
    later in the same batch keeps its cached value, not the re-quantized store value).

    Args:
        t: The tables (caches and stores are modified in place).
        ids: int64[B, T] table-local row ids.
        seed: RNG seed.
        step: Step counter for the RNG (purpose ``PURPOSE_EVICT``).

    Returns:
        float32[B, T, D] values and int32[B, T] cache slots (-1 for uncached tables), the
        slots being hints for :func:`update`.

    """
    dim = int(t.meta[0, META_DIM]) if ids.shape[1] else 0
    out = torch.empty(ids.shape[0], ids.shape[1], dim)
    slots = torch.empty(ids.shape, dtype=torch.int32)
    for i in range(ids.shape[1]):
        _admit_table(t, i, ids[:, i], seed, step, out[:, i], slots[:, i])
    return out, slots


def _aggregate(rows: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum gradient rows per unique id, in sample order: (int64[U], float32[U, D])."""
    n = rows.shape[0]
    order = torch.argsort(rows * n + torch.arange(n))
    srows = rows[order]
    uniq, counts = torch.unique_consecutive(srows, return_counts=True)
    seg = torch.repeat_interleave(torch.arange(len(uniq)), counts)
    rank = torch.arange(n) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    acc = torch.zeros(len(uniq), grad.shape[1], dtype=torch.float32)
    for r in range(int(counts.max()) if n else 0):
        m = rank == r
        acc[seg[m]] = acc[seg[m]] + grad[order[m]]
    return uniq, acc


def _multiplier(t: TableTensors, i: int, rows: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    lr, eps = t.hparams[i, 0], t.hparams[i, 1]
    if int(t.meta[i, META_OPTIMIZER]) == 0:
        return lr.expand(rows.shape[0])
    sumsq = torch.zeros(rows.shape[0], dtype=torch.float32)
    for d in range(acc.shape[1]):
        sumsq = sumsq + acc[:, d] * acc[:, d]
    mom = t.momentum[i][rows] + sumsq / torch.full_like(sumsq, float(acc.shape[1]))
    t.momentum[i][rows] = mom
    # float64 sqrt rounded once to float32 is the correctly rounded float32 sqrt (what the
    # C++ sqrtf gives); torch's float32 sqrt can be 1 ulp off on some paths.
    return lr / (torch.sqrt(mom.double()).float() + eps)


def _update_table(t: TableTensors, i: int, rows, grad, seed: int, step: int) -> None:
    uniq, acc = _aggregate(rows, grad)
    step_rows = _multiplier(t, i, uniq, acc)[:, None] * acc
    slots = find_slots(t.cache_tags[i], uniq)
    hit = slots >= 0
    cache = t.cache_rows[i]
    cache[slots[hit]] = cache[slots[hit]] - step_rows[hit]
    miss_rows = uniq[~hit]
    kind, dim = Precision.from_code(int(t.meta[i, META_KIND])), int(t.meta[i, META_DIM])
    new = dequantize_rows(t.stores[i][miss_rows], kind, dim) - step_rows[~hit]
    rk = None
    if bool(t.meta[i, META_STOCHASTIC]):
        key = stream_key(seed, int(t.meta[i, META_STREAM]), PURPOSE_UPDATE, step)
        offset, stride = int(t.meta[i, META_ROW_OFFSET]), int(t.meta[i, META_ROW_STRIDE])
        rk = row_keys(key, offset + miss_rows * stride)
    t.stores[i][miss_rows] = quantize_rows(new, kind, rk)
    t.stats[i][3] += len(miss_rows)


def update(
    t: TableTensors,
    ids: torch.Tensor,
    grad: torch.Tensor,
    seed: int,
    step: int,
    slots: torch.Tensor | None = None,
) -> None:
    """Fused backward: aggregate per unique row, optimizer step, write cache or store.

    Args:
        t: The tables (modified in place).
        ids: int64[B, T] table-local row ids.
        grad: float32[B, T, D] gradient of the forward output.
        seed: RNG seed.
        step: Step counter for the RNG.
        slots: int32[B, T] slots from :func:`train_forward`: lookup hints of the compiled
            kernels, ignored here (results never depend on them).

    """
    for i in range(ids.shape[1]):
        _update_table(t, i, ids[:, i], grad[:, i, :], seed, step)


def bag_lookup(
    store: torch.Tensor, bits: int, indices: torch.Tensor, offsets: torch.Tensor, dim: int
) -> torch.Tensor:
    """Inference sum-pooled lookup of an INT8/INT4/INT2 store.

    Args:
        store: uint8[R, row_bytes] fused rows.
        bits: 8, 4 or 2.
        indices: int64[N] row ids.
        offsets: int64[B + 1] bag boundaries.
        dim: Embedding dimension D.

    Returns:
        float32[B, D] sums of the dequantized rows of each bag.

    """
    kind = {8: Precision.int8, 4: Precision.int4, 2: Precision.int2}[bits]
    values = dequantize_rows(store[indices], kind, dim)
    bags = torch.repeat_interleave(torch.arange(offsets.numel() - 1), offsets.diff())
    return torch.zeros(offsets.numel() - 1, dim).index_add_(0, bags, values)
