"""Cyclic row shards train exactly like the unsplit table (one process, no communication)."""

from __future__ import annotations

import pytest
import torch

from ssl_rec.distributed.cyclic_layout import check_row_split, shard_rows, split_table
from ssl_rec.distributed.local_shards import LocalShards, shard_lookup
from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec

SPECS = [
    TableSpec("int8", 0.2, "lru"),
    TableSpec("int4", 0.1, "lfu"),
    TableSpec("fp16", optimizer="sgd"),
    TableSpec("int2", 0.0),
]


def _batches(rows: int, steps: int, size: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    # Skewed ids: hot rows compete for cache ways, cold ones go through stochastic rounding.
    return [(torch.rand(size, generator=g) ** 3 * rows).long() for _ in range(steps)]


@pytest.mark.parametrize("kernels", ["reference", "compiled"])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.precision.value}-{s.cache_fraction}")
def test_cyclic_shards_train_bit_for_bit_like_the_table(spec, kernels, monkeypatch) -> None:
    monkeypatch.setenv("SSL_REC_KERNELS", kernels)
    rows, n = 1600, 4
    whole = MixedPrecisionEmbeddingCollection([rows], 8, spec, seed=5).train()
    table = whole.group.tables[0]
    shards = [LocalShards([split_table(table, n, j)], 0, seed=5, dim=8) for j in range(n)]
    for ids in _batches(rows, steps=6, size=96):
        weights = torch.randn(ids.numel(), 8)
        (whole(ids[:, None])[:, 0] * weights).sum().backward()
        for j, shard in enumerate(shards):  # each shard sees its ids, in batch order
            mine = ids % n == j
            out = shard_lookup(shard, torch.zeros(0, 0, dtype=torch.int64), [ids[mine] // n], True)
            (out * weights[mine]).sum().backward()
    for j, shard in enumerate(shards):
        piece = shard.tables[0]
        assert torch.equal(piece.store, table.store[j::n])
        assert torch.equal(
            piece.momentum, table.momentum[j::n] if spec.optimizer != "sgd" else piece.momentum
        )
        sets = table.cache.sets
        assert torch.equal(piece.cache.tags, table.cache.tags[j::n])
        if sets:
            mine = table.cache.rows.view(sets, -1)[j::n].reshape(-1)
            assert torch.equal(piece.cache.rows.view(-1), mine)
    hits = sum(s.tables[0].cache.stats[0] for s in shards)
    assert hits == table.cache.stats[0]


def test_shard_rows_cover_the_table() -> None:
    assert [shard_rows(10, 4, j) for j in range(4)] == [3, 3, 2, 2]
    assert sum(shard_rows(10_131_227, 8, j) for j in range(8)) == 10_131_227


def test_row_split_needs_whole_cache_sets() -> None:
    check_row_split("t", 1000, TableSpec("int8", 0.2), 4)  # 25 sets, rounded to 24: splits
    with pytest.raises(ValueError, match="cache sets do not divide"):
        check_row_split("t", 1000, TableSpec("int8", 0.05), 4)  # 6 sets: too few to round
    with pytest.raises(ValueError, match="cannot be split"):
        check_row_split("t", 3, TableSpec("fp32"), 4)
