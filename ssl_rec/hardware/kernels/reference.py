"""Pure-torch reference kernels: the oracle every compiled kernel must match.

The arithmetic is written operation by operation in the order of ``csrc/`` (gradient sums
in sample order, the Adagrad sum of squares in 16 lanes then pairwise, no fused
multiply-add), so the compiled kernels reproduce it bit for bit and integer stores match
exactly. Cache admission is a Python loop (``replacement.py``): use this module on small
batches only.

A training step is ``plan = admit(...)`` (dedup of each table's ids, cache admission with
eviction write-back), ``gather(plan)`` (the values) and, in backward, ``update(plan, grad)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ssl_rec.hardware.kernels.checks import (
    check_bag,
    check_grad,
    check_ids,
    check_plan,
    check_tables,
)
from ssl_rec.hardware.kernels.replacement import assign_slots
from ssl_rec.hardware.kernels.table_meta import (
    HPARAM_EPS,
    HPARAM_LR,
    HPARAM_WEIGHT_DECAY,
    META_ADMISSION,
    META_DIM,
    META_KIND,
    META_OPTIMIZER,
    META_POLICY,
    META_ROW_OFFSET,
    META_ROW_STRIDE,
    META_STOCHASTIC,
    META_STREAM,
    AdmittedBatch,
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

LANES = 16

__all__ = ["admit", "bag_lookup", "find_slots", "forward", "gather", "update"]


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


def _kind(t: TableTensors, i: int) -> Precision:
    return Precision.from_code(int(t.meta[i, META_KIND]))


def _values(t: TableTensors, i: int, rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """float32[n, D] values of rows held in ``slots`` (int64[n], -1: read the store)."""
    values = dequantize_rows(t.stores[i][rows], _kind(t, i), int(t.meta[i, META_DIM]))
    hit = slots >= 0
    values[hit] = t.cache_rows[i][slots[hit]]
    return values


def _current_slots(t: TableTensors, i: int, rows: torch.Tensor, hints: torch.Tensor):
    tags = t.cache_tags[i]
    if tags.shape[0] == 0:
        return torch.full_like(rows, -1)
    hints = hints.to(torch.int64)
    valid = hints >= 0
    holds = torch.zeros_like(valid)
    flat = tags.reshape(-1).to(torch.int64)
    holds[valid] = flat[hints[valid]] == rows[valid] // tags.shape[0]
    return torch.where(holds, hints, find_slots(tags, rows))


def forward(t: TableTensors, ids: torch.Tensor) -> torch.Tensor:
    """Eval lookup (cache, else dequantized store) for every table; no side effects.

    Args:
        t: The tables.
        ids: int64[B, T] table-local row ids.

    Returns:
        float32[B, T, D].

    """
    check_ids(ids, check_tables(t))
    dim = int(t.meta[0, META_DIM]) if ids.shape[1] else 0
    cols = [
        _values(t, i, ids[:, i], find_slots(t.cache_tags[i], ids[:, i]))
        for i in range(ids.shape[1])
    ]
    return torch.stack(cols, dim=1) if cols else torch.empty(ids.shape[0], 0, dim)


def _dedupe(col: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unique rows in first-occurrence order, each sample's index, samples per row."""
    uniq, inv, counts = torch.unique(col, return_inverse=True, return_counts=True)
    first = torch.full((len(uniq),), len(col), dtype=torch.int64)
    first.scatter_reduce_(0, inv, torch.arange(len(col)), reduce="amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order))
    return uniq[order], rank[inv], counts[order]


def _admit_table(
    t: TableTensors, i: int, col, seed: int, step: int, locks, plan: AdmittedBatch
) -> None:
    rows, inverse, counts = _dedupe(col)
    u = len(rows)
    plan.rows[i, :u], plan.inverse[i], plan.num_unique[i] = rows, inverse.int(), u
    if t.cache_tags[i].shape[0] == 0:
        return
    lock_slots = [p.slots[i, : int(p.num_unique[i])] for p in locks]
    policy, admission = int(t.meta[i, META_POLICY]), int(t.meta[i, META_ADMISSION])
    slots, evicts, loads, counters = assign_slots(
        t.cache_tags[i], t.cache_state[i], policy, rows, counts, lock_slots, admission
    )
    plan.slots[i, :u] = slots
    t.stats[i][:3] += torch.tensor(counters)
    kind, cache, store = _kind(t, i), t.cache_rows[i], t.stores[i]
    key = stream_key(seed, int(t.meta[i, META_STREAM]), PURPOSE_EVICT, step)
    offset, sr = int(t.meta[i, META_ROW_OFFSET]), bool(t.meta[i, META_STOCHASTIC])
    stride = int(t.meta[i, META_ROW_STRIDE])
    for slot, old in evicts:
        if not 0 <= old < store.shape[0]:
            raise ValueError(f"table {i}: cache slot {slot} names no row (corrupt cache state)")
        rk = row_keys(key, torch.tensor([offset + old * stride])) if sr else None
        store[old] = quantize_rows(cache[slot : slot + 1], kind, rk)[0]
    for slot, row in loads:
        cache[slot] = dequantize_rows(store[row : row + 1], kind, cache.shape[1])[0]


def admit(
    t: TableTensors,
    ids: torch.Tensor,
    seed: int,
    step: int,
    locks: Sequence[AdmittedBatch] = (),
    parallel: bool = True,
) -> AdmittedBatch:
    """Cache admission of a batch (see ``replacement.py`` for the policy).

    Each table's ids are deduplicated (first-occurrence order); cached tables admit their
    unique rows: a victim's FP32 row is written back to the store with stochastic rounding
    (purpose ``PURPOSE_EVICT``) and the new row loaded. Statistics count samples: a miss
    that is admitted counts once, its batch's other samples as hits.

    Args:
        t: The tables (caches, stores and statistics are modified in place).
        ids: int64[B, T] table-local row ids.
        seed: RNG seed.
        step: Step counter for the RNG.
        locks: Plans still waiting for their backward: their rows are not evicted.
        parallel: Ignored (the compiled kernels' threading switch).

    Returns:
        The :class:`AdmittedBatch` that ``gather`` and ``update`` read.

    """
    shapes = check_tables(t)
    check_ids(ids, shapes)
    for p in locks:
        check_plan(p, t, shapes, "lock plan")
    n, b = ids.shape[1], ids.shape[0]
    plan = AdmittedBatch(
        torch.zeros(n, b, dtype=torch.int64),
        torch.zeros(n, dtype=torch.int64),
        torch.zeros(n, b, dtype=torch.int32),
        torch.full((n, b), -1, dtype=torch.int32),
    )
    for i in range(n):
        _admit_table(t, i, ids[:, i], seed, step, locks, plan)
    return plan


def gather(t: TableTensors, plan: AdmittedBatch) -> torch.Tensor:
    """Values of an admitted batch: float32[B, T, D], each its row's current value.

    Reads the plan's slots, valid while the plan is pending (its rows are locked), and no
    cache tag, so it may run beside an admission of another batch.
    """
    shapes = check_tables(t)
    check_plan(plan, t, shapes, "plan")
    n, b = plan.inverse.shape
    dim = shapes[0][1] if shapes else 0
    out = torch.empty(b, n, dim)
    for i in range(n):
        u = int(plan.num_unique[i])
        values = _values(t, i, plan.rows[i, :u], plan.slots[i, :u].long())
        out[:, i] = values[plan.inverse[i].long()]
    return out


def _aggregate(inverse: torch.Tensor, grad: torch.Tensor, u: int) -> torch.Tensor:
    """float32[U, D]: each unique row's gradient rows summed in sample order (first as is)."""
    n = inverse.shape[0]
    order = torch.argsort(inverse * n + torch.arange(n))
    counts = torch.bincount(inverse, minlength=u)
    rank = torch.arange(n) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    seg = inverse[order]
    acc = torch.zeros(u, grad.shape[1], dtype=torch.float32)
    for r in range(int(counts.max()) if n else 0):
        m = rank == r
        acc[seg[m]] = grad[order[m]] if r == 0 else acc[seg[m]] + grad[order[m]]
    return acc


def _sum_squares(acc: torch.Tensor) -> torch.Tensor:
    """Row sums of squares in the kernels' order: 16 lanes over columns, then pairwise."""
    u, dim = acc.shape
    padded = torch.zeros(u, -(-dim // LANES) * LANES)
    padded[:, :dim] = acc
    chunks = padded.view(u, -1, LANES)
    lanes = torch.zeros(u, LANES)
    for c in range(chunks.shape[1]):
        lanes = lanes + chunks[:, c] * chunks[:, c]
    width = LANES // 2
    while width:
        lanes = lanes[:, :width] + lanes[:, width : 2 * width]
        width //= 2
    return lanes[:, 0]


def _multiplier(t: TableTensors, i: int, rows: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    lr, eps = t.hparams[i, HPARAM_LR], t.hparams[i, HPARAM_EPS]
    if int(t.meta[i, META_OPTIMIZER]) == 0:
        return lr.expand(rows.shape[0])
    sumsq = _sum_squares(acc)
    mom = t.momentum[i][rows] + sumsq / torch.full_like(sumsq, float(acc.shape[1]))
    t.momentum[i][rows] = mom
    # float64 sqrt rounded once to float32 is the correctly rounded float32 sqrt (what the
    # C++ sqrtf gives); torch's float32 sqrt can be 1 ulp off on some paths.
    return lr / (torch.sqrt(mom.double()).float() + eps)


def _update_table(t: TableTensors, i: int, plan: AdmittedBatch, grad, seed: int, step: int) -> None:
    u = int(plan.num_unique[i])
    acc = _aggregate(plan.inverse[i].long(), grad[:, i, :], u)
    live = ~(acc == 0).all(dim=1)  # rows whose gradient is exactly zero are not touched
    rows, acc = plan.rows[i, :u][live], acc[live]
    slots = _current_slots(t, i, rows, plan.slots[i, :u][live])
    hit = slots >= 0
    miss_rows = rows[~hit]
    kind, dim, cache = _kind(t, i), int(t.meta[i, META_DIM]), t.cache_rows[i]
    stored = dequantize_rows(t.stores[i][miss_rows], kind, dim)
    decay = t.hparams[i, HPARAM_WEIGHT_DECAY]
    if decay != 0:  # L2 on the touched rows' current values, as FBGEMM's weight_decay_mode L2
        values = torch.empty_like(acc)
        values[hit], values[~hit] = cache[slots[hit]], stored
        acc = acc + decay * values
    step_rows = _multiplier(t, i, rows, acc)[:, None] * acc
    cache[slots[hit]] = cache[slots[hit]] - step_rows[hit]
    new = stored - step_rows[~hit]
    rk = None
    if bool(t.meta[i, META_STOCHASTIC]):
        key = stream_key(seed, int(t.meta[i, META_STREAM]), PURPOSE_UPDATE, step)
        offset, stride = int(t.meta[i, META_ROW_OFFSET]), int(t.meta[i, META_ROW_STRIDE])
        rk = row_keys(key, offset + miss_rows * stride)
    t.stores[i][miss_rows] = quantize_rows(new, kind, rk)
    t.stats[i][3] += len(miss_rows)


def update(t: TableTensors, plan: AdmittedBatch, grad: torch.Tensor, seed: int, step: int) -> None:
    """Fused backward: per-row gradient sum, optimizer step, cache or store write.

    Rows whose summed gradient is exactly zero (e.g. masked fields) are skipped. With a
    weight decay ``wd`` (``hparams[:, HPARAM_WEIGHT_DECAY]``) each updated row's gradient sum
    ``g`` becomes ``g + wd * w``, ``w`` the row's current value, before the optimizer step
    (FBGEMM's L2 mode, lazy: rows the batch does not touch do not decay). Cached rows are
    updated exactly in FP32, uncached ones in the store with stochastic rounding (purpose
    ``PURPOSE_UPDATE``).

    Args:
        t: The tables (modified in place).
        plan: The batch's plan from :func:`admit`.
        grad: float32[B, T, D] gradient of the gathered output.
        seed: RNG seed.
        step: Step counter for the RNG.

    """
    shapes = check_tables(t)
    check_plan(plan, t, shapes, "plan")
    check_grad(grad, plan, shapes)
    for i in range(len(shapes)):
        _update_table(t, i, plan, grad, seed, step)


def bag_lookup(
    store: torch.Tensor, bits: int, indices: torch.Tensor, offsets: torch.Tensor, dim: int
) -> torch.Tensor:
    """Inference sum-pooled lookup of an INT8/INT4 store.

    Args:
        store: uint8[R, row_bytes] fused rows.
        bits: 8 or 4.
        indices: int64[N] row ids in ``[0, R)``.
        offsets: int64[B + 1] bag boundaries: 0, non-decreasing, ``offsets[-1] == N``.
        dim: Embedding dimension D.

    Returns:
        float32[B, D] sums of the dequantized rows of each bag.

    """
    check_bag(store, bits, indices, offsets, dim)
    kind = Precision.int8 if bits == 8 else Precision.int4
    values = dequantize_rows(store[indices], kind, dim)
    bags = torch.repeat_interleave(torch.arange(offsets.numel() - 1), offsets.diff())
    return torch.zeros(offsets.numel() - 1, dim).index_add_(0, bags, values)
