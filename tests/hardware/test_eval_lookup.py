"""Evaluation lookups of cached low-precision tables: the current value of every row (the cache
where the row is cached, the dequantized store elsewhere), and nothing written: no admission,
no replacement-state or statistics update, no step of the RNG counter."""

from __future__ import annotations

import pytest
import torch

from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec
from ssl_rec.hardware.kernels import reference
from ssl_rec.hardware.kernels.dispatch import get_kernels
from ssl_rec.hardware.quantization import dequantize_rows

CARDS = [300, 1000, 40]
DIM = 16
SPECS = {
    "int8_cache5": TableSpec("int8", 0.05),
    "int4_cache1": TableSpec("int4", 0.01),
    "int8_lfu": TableSpec("int8", 0.1, cache_policy="lfu"),
}


def _zipf_ids(batch: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    cols = [(torch.rand(batch, generator=gen) ** 3 * c).long() for c in CARDS]
    return torch.stack(cols, dim=1)


def _trained(spec: TableSpec, steps: int = 6) -> MixedPrecisionEmbeddingCollection:
    """A collection whose caches hold rows whose values differ from their store rows."""
    emb = MixedPrecisionEmbeddingCollection(CARDS, DIM, spec, seed=3).train()
    for step in range(steps):
        out = emb(_zipf_ids(256, step))
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(step)))
    return emb


def _state(emb: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in emb.state_dict().items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_eval_lookup_reads_cache_else_store_and_writes_nothing(name, threads, simd) -> None:
    emb = _trained(SPECS[name])
    assert emb.cache_stats()["hits"] > 0
    before = _state(emb)
    # 702 samples: several chunks of the lookup's pipeline, the last one partial
    ids = torch.cat([_zipf_ids(700, 99), torch.tensor([[c - 1 for c in CARDS], [0, 0, 0]])])
    emb.eval()
    out = emb(ids)
    assert not out.requires_grad and out.shape == (len(ids), len(CARDS), DIM)
    after = _state(emb)
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert torch.equal(after[key], value), f"an eval lookup wrote {key}"
    # the value of every (sample, table): the cached row where cached, else the store's row
    tables = emb.group.tables
    expected = torch.empty_like(out)
    cached_reads = 0
    for f, table in enumerate(tables):
        col = ids[:, f]
        slots = reference.find_slots(table.cache.tags, col)
        values = dequantize_rows(table.store[col], table.spec.precision, DIM)
        hit = slots >= 0
        values[hit] = table.cache.rows[slots[hit]]
        expected[:, f] = values
        cached_reads += int(hit.sum())
    assert cached_reads > 0
    assert torch.equal(out, expected)
    assert torch.equal(out, reference.forward(emb.group.tensors(), ids))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_cached_row_is_read_from_the_cache_not_the_stale_store(name) -> None:
    emb = _trained(SPECS[name])
    table = emb.group.tables[1]
    sets = table.cache.tags.shape[0]
    slot = int((table.cache.tags.reshape(-1) >= 0).nonzero()[0])
    row = int(table.cache.tags.reshape(-1)[slot]) * sets + slot // table.cache.tags.shape[1]
    stale = dequantize_rows(table.store[[row]], table.spec.precision, DIM)[0]
    cached = table.cache.rows[slot]
    assert not torch.equal(stale, cached)  # the cache holds updates the store does not have
    ids = torch.zeros(1, len(CARDS), dtype=torch.int64)
    ids[0, 1] = row
    with torch.no_grad():
        assert torch.equal(emb.eval()(ids)[0, 1], cached)
    assert torch.equal(emb.dequantize_rows(1, torch.tensor([row]))[0], cached)


def test_no_grad_lookup_in_training_mode_admits_nothing() -> None:
    emb = _trained(SPECS["int8_cache5"])
    before, stats = _state(emb), emb.cache_stats()
    ids = _zipf_ids(300, 7)
    with torch.no_grad():
        out = emb(ids)
    assert emb.training and torch.equal(out, emb.eval()(ids))
    for key, value in before.items():
        assert torch.equal(emb.state_dict()[key], value), key
    assert emb.cache_stats()["hits"] == stats["hits"]


def test_eval_lookup_equals_fp32_tables_holding_the_same_values() -> None:
    emb = _trained(SPECS["int4_cache1"])
    fp32 = MixedPrecisionEmbeddingCollection(CARDS, DIM, TableSpec("fp32"), seed=3)
    fp32.load_weights(emb.float_weights())
    ids = _zipf_ids(500, 11)
    with torch.no_grad():
        assert torch.equal(emb.eval()(ids), fp32.eval()(ids))
    assert torch.equal(get_kernels().forward(emb.group.tensors(), ids), fp32.eval()(ids))
