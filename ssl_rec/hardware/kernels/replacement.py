"""Cache admission of one table's unique rows (reference, pure Python).

The twin of ``csrc/admission.cpp`` and the definition of the cache's semantics, as in
FBGEMM's TBE cache: all unique rows of a batch are looked up first (hits are touched and
locked), then each miss, in first-occurrence order, takes a way of its set that holds no
locked row: the first empty one, else the pseudo-LRU tree's choice (turning away from
subtrees whose ways are all locked) or the least-frequent way (``lfu``, lowest index on
ties). A miss whose ways are all locked stays uncached for this batch. Rows of plans still
waiting for their backward are locked too, so an admission run ahead (prefetch) never
evicts a row whose update is pending.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ssl_rec.hardware.kernels.table_meta import CACHE_WAYS, EMPTY_TAG, LFU_MAX

__all__ = ["assign_slots", "plru_touch", "plru_victim"]


def plru_touch(bits: int, way: int) -> int:
    """Tree pseudo-LRU bits after an access to ``way`` (each node points away from it)."""
    node = 0
    for level in range(3):
        right = (way >> (2 - level)) & 1
        bits = (bits & ~(1 << node)) | ((1 - right) << node)
        node = 2 * node + 1 + right
    return bits


def plru_victim(bits: int, locked: int) -> int:
    """The tree's victim way, avoiding any subtree whose ways are all ``locked`` (a bit mask)."""
    node, lo, width = 0, 0, CACHE_WAYS
    for _ in range(3):
        right = (bits >> node) & 1
        width >>= 1
        mask = ((1 << width) - 1) << (lo + right * width)
        if locked & mask == mask:
            right ^= 1
        lo += right * width
        node = 2 * node + 1 + right
    return lo


def _touch(state: torch.Tensor, policy: int, s: int, way: int, fresh: bool) -> None:
    if policy == 0:
        state[s, 0] = plru_touch(int(state[s, 0]), way)
        return
    if fresh:
        state[s, way] = 1
        return
    if int(state[s, way]) >= LFU_MAX:
        state[s] = state[s] // 2  # aging keeps counts bounded and lets old favourites go
    state[s, way] += 1


def _victim(tags: list[int], state: torch.Tensor, policy: int, s: int, locked: int) -> int:
    if locked == 0xFF:
        return -1
    for w in range(CACHE_WAYS):
        if tags[w] == EMPTY_TAG and not (locked >> w) & 1:
            return w
    if policy == 0:
        return plru_victim(int(state[s, 0]), locked)
    counts = state[s].tolist()
    free = [w for w in range(CACHE_WAYS) if not (locked >> w) & 1]
    return min(free, key=lambda w: (counts[w], w))


def _locked_sets(lock_slots: Sequence[torch.Tensor]) -> dict[int, int]:
    locked: dict[int, int] = {}
    for slots in lock_slots:
        for slot in slots[slots >= 0].tolist():
            locked[slot // CACHE_WAYS] = locked.get(slot // CACHE_WAYS, 0) | 1 << (
                slot % CACHE_WAYS
            )
    return locked


def assign_slots(
    tags: torch.Tensor,
    state: torch.Tensor,
    policy: int,
    rows: torch.Tensor,
    counts: torch.Tensor,
    lock_slots: Sequence[torch.Tensor],
    admission: int = 1,
) -> tuple[torch.Tensor, list[tuple[int, int]], list[tuple[int, int]], list[int]]:
    """Slots for one table's unique rows; updates ``tags`` and ``state`` in place.

    Args:
        tags: int16[S, W] cache tags.
        state: uint8[S, 1] or [S, W] replacement state.
        policy: 0 (``lru``) or 1 (``lfu``).
        rows: int64[U] unique rows in first-occurrence order.
        counts: int64[U] samples of each row in the batch.
        lock_slots: int32 slots of rows of pending plans (-1 entries ignored).
        admission: A missed row with fewer samples than this stays uncached unless the way
            it would take is empty.

    Returns:
        int32[U] slots (-1: uncached), the evictions ``(slot, old row)``, the admissions
        ``(slot, row)`` and ``[hits, misses, evictions]`` counted per sample.

    """
    num_sets = tags.shape[0]
    locked = _locked_sets(lock_slots)
    all_tags = tags.tolist()
    slots = [-2] * len(rows)
    hits = misses = 0
    for u, row in enumerate(rows.tolist()):
        s, quot = row % num_sets, row // num_sets
        if quot in all_tags[s]:
            way = all_tags[s].index(quot)
            slots[u], hits = s * CACHE_WAYS + way, hits + int(counts[u])
            _touch(state, policy, s, way, fresh=False)
            locked[s] = locked.get(s, 0) | 1 << way
    evicts, loads = [], []
    for u, row in enumerate(rows.tolist()):
        if slots[u] != -2:
            continue
        s = row % num_sets
        way = _victim(all_tags[s], state, policy, s, locked.get(s, 0))
        if way < 0 or (int(counts[u]) < admission and all_tags[s][way] != EMPTY_TAG):
            slots[u], misses = -1, misses + int(counts[u])
            continue
        misses, hits = misses + 1, hits + int(counts[u]) - 1
        slot = s * CACHE_WAYS + way
        if all_tags[s][way] != EMPTY_TAG:
            evicts.append((slot, all_tags[s][way] * num_sets + s))
        loads.append((slot, row))
        all_tags[s][way] = row // num_sets
        tags[s, way] = row // num_sets
        _touch(state, policy, s, way, fresh=True)
        locked[s] = locked.get(s, 0) | 1 << way
        slots[u] = slot
    return torch.tensor(slots, dtype=torch.int32), evicts, loads, [hits, misses, len(evicts)]
