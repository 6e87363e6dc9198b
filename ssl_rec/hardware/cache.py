"""Set-associative FP32 row cache with pseudo-LRU or LFU replacement.

As in FBGEMM's TBE cache (``lxu_cache``), a row may only live in the ``CACHE_WAYS`` slots
of set ``row % S``; a slot stores the quotient ``row // S`` as an int16 tag. Metadata
therefore scales with the cache, not the table: 2 bytes of tag per slot plus, for ``lru``,
one byte per set holding the 7 bits of an 8-way tree pseudo-LRU (the replacement used by
CPU caches), or, for ``lfu``, a saturating uint8 counter per slot that is halved for the
whole set when one saturates (aging, bounded memory). See "Mixed-Precision Embedding Using a
Cache" (Yang et al., 2020, https://arxiv.org/abs/2010.11305).

The cache management itself runs in the kernels (``kernels.reference.train_forward`` and its
compiled twin); this module owns the buffers, geometry and statistics.
"""

from __future__ import annotations

import torch

from ssl_rec.hardware import huge_pages
from ssl_rec.hardware.buffer_epoch import TracksReplacement
from ssl_rec.hardware.kernels.table_meta import CACHE_WAYS, EMPTY_TAG
from ssl_rec.hardware.spec import TableSpec

TAG_LIMIT = 32767
# Set counts are rounded down to a multiple of a power of two (at most this, and at most an
# eighth of the sets), so a table split row-wise over that many ranks gives every rank whole
# sets: the shards then cache exactly the rows the unsplit table would.
MAX_SET_MULTIPLE = 128

__all__ = ["RowCache", "cache_geometry", "cache_metadata_bytes"]


def cache_geometry(num_rows: int, spec: TableSpec) -> int:
    """Number of cache sets S (each of ``CACHE_WAYS`` slots) of a table; 0 without cache.

    ``S = max(1, floor(cache_fraction * R / W))`` for cached specs, rounded down to a
    multiple of ``m``, the largest power of two ``<= min(MAX_SET_MULTIPLE, S // 8)`` (at most
    1/8 of the sets, under 0.2% for ``S >= 65536``): a table sharded row-wise over any power
    of two of ranks up to ``m`` splits into whole sets.

    Args:
        num_rows: Rows R of the table.
        spec: The table's spec.

    Returns:
        S, the number of sets.

    Raises:
        ValueError: If the fraction is so small that tags would overflow int16.

    """
    if not spec.cached or num_rows == 0:
        return 0
    sets = max(1, int(spec.cache_fraction * num_rows) // CACHE_WAYS)
    multiple = 1 << min(MAX_SET_MULTIPLE.bit_length() - 1, max(0, (sets // 8).bit_length() - 1))
    sets -= sets % multiple
    if (num_rows - 1) // sets > TAG_LIMIT:
        raise ValueError(
            f"cache_fraction={spec.cache_fraction} is too small for a table of {num_rows} rows: "
            f"needs at least {CACHE_WAYS * (num_rows // TAG_LIMIT + 1) / num_rows:.2e}"
        )
    return sets


def cache_metadata_bytes(sets: int, policy: str) -> int:
    """Bytes of cache metadata: int16 tags, replacement state and the int64[4] statistics."""
    if sets == 0:
        return 0
    state = sets if policy == "lru" else sets * CACHE_WAYS
    return sets * CACHE_WAYS * 2 + state + 4 * 8


class RowCache(TracksReplacement):
    """Buffers of one table's FP32 cache.

    Args:
        num_rows: Rows R of the table.
        dim: Embedding dimension D.
        spec: The table's spec (``cache_fraction``, ``cache_policy``).
        sets: Number of sets (default :func:`cache_geometry`); a row-wise shard holds its
            share of the logical table's sets.
        meta: Declare the buffers on the meta device (no memory; see ``table_allocation``).

    Attributes:
        rows: float32[S * W, D] cached rows.
        tags: int16[S, W] row quotients, -1 for an empty slot.
        state: uint8[S, 1] pseudo-LRU bits or uint8[S, W] LFU counters.
        stats: int64[4] hits, misses, evictions, store writes.

    Example:
        >>> RowCache(1000, 16, TableSpec("int8", 0.1)).rows.shape
        torch.Size([96, 16])

    """

    def __init__(
        self, num_rows: int, dim: int, spec: TableSpec, sets: int | None = None, meta: bool = False
    ) -> None:
        super().__init__()
        self.sets = cache_geometry(num_rows, spec) if sets is None else sets
        if self.sets < 0 or (self.sets and (num_rows - 1) // self.sets > TAG_LIMIT):
            raise ValueError(f"sets={self.sets} is invalid for a cache of a {num_rows}-row table")
        self.policy = spec.cache_policy
        slots = self.sets * CACHE_WAYS
        state_cols = 1 if self.policy == "lru" else CACHE_WAYS
        device = "meta" if meta else "cpu"
        rows = torch.empty((slots, dim), device=device) if meta else huge_pages.zeros((slots, dim))
        self.register_buffer("rows", rows)
        tags = torch.full((self.sets, CACHE_WAYS), EMPTY_TAG, dtype=torch.int16, device=device)
        self.register_buffer("tags", tags)
        state = torch.zeros(self.sets, state_cols, dtype=torch.uint8, device=device)
        self.register_buffer("state", state)
        self.register_buffer("stats", torch.zeros(4, dtype=torch.int64))

    def metadata_bytes(self) -> int:
        """Bytes of tags, replacement state and statistics."""
        return cache_metadata_bytes(self.sets, self.policy)

    def cache_stats(self, row_bytes: int) -> dict[str, float]:
        """Hit rate, hits, misses, evictions, store writes and bytes written back.

        Args:
            row_bytes: Bytes of one stored row (for ``writeback_bytes``).

        Returns:
            Counters since construction (or the last ``load_state_dict``).

        """
        hits, misses, evictions, writes = (float(v) for v in self.stats.tolist())
        lookups = hits + misses
        return {
            "hit_rate": hits / lookups if lookups else 0.0,
            "hits": hits,
            "misses": misses,
            "evictions": evictions,
            "store_writes": writes,
            "writeback_bytes": (evictions + writes) * row_bytes,
            "capacity_rows": float(self.rows.shape[0]),
        }
