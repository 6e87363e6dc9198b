import numpy as np
import pytest
import torch

from ssl_rec.hardware import MixedPrecisionEmbedding, TableSpec
from ssl_rec.hardware.cache import cache_geometry


def _zipf_with_scans(n_rows, n, seed):
    rng = np.random.default_rng(seed)
    hot = np.minimum(rng.zipf(1.2, size=n) - 1, n_rows - 1)
    stream = hot.copy()
    for start in range(0, n, 2000):  # periodic one-off scans over cold rows
        stream[start : start + 300] = rng.integers(n_rows // 2, n_rows, size=min(300, n - start))
    return torch.from_numpy(stream.astype(np.int64))


@pytest.mark.parametrize("kernels", ["compiled"])
def test_lfu_beats_lru_on_zipf_with_scans(monkeypatch, kernels):
    monkeypatch.setenv("SSL_REC_KERNELS", kernels)
    stream = _zipf_with_scans(20_000, 20_000, seed=0)
    rates = {}
    for policy in ("lru", "lfu"):
        spec = TableSpec("int8", 0.01, policy, admission_count=1)
        emb = MixedPrecisionEmbedding(20_000, 8, spec, seed=0).train()
        for chunk in stream.split(200):
            emb(chunk).sum().backward()
        rates[policy] = emb.cache_stats()["hit_rate"]
    assert rates["lfu"] >= rates["lru"] > 0.2, rates


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_admission_count_keeps_one_off_rows_out(policy):
    """Rows seen once in a batch stay in the store: fewer evictions, a higher hit rate."""
    stream = _zipf_with_scans(20_000, 20_000, seed=0)
    stats = {}
    for count in (1, 2):
        spec = TableSpec("int8", 0.01, policy, admission_count=count)
        emb = MixedPrecisionEmbedding(20_000, 8, spec, seed=0).train()
        for chunk in stream.split(200):
            emb(chunk).sum().backward()
        stats[count] = emb.cache_stats()
    assert stats[2]["hit_rate"] > stats[1]["hit_rate"], stats
    assert stats[2]["evictions"] < stats[1]["evictions"] / 2, stats


def test_admission_count_admits_into_empty_ways_and_repeated_rows():
    emb = MixedPrecisionEmbedding(10_000, 8, TableSpec("int8", 0.1, admission_count=3)).train()
    once = torch.arange(0, 10_000, 37)[:200]  # 200 rows over all 125 sets: empty ways
    emb(once).sum().backward()
    assert emb.cache_stats()["misses"] == 200
    emb(once).sum().backward()  # all cached though each was seen once
    assert emb.cache_stats()["hits"] == 200


def test_lru_keeps_a_recent_working_set():
    emb = MixedPrecisionEmbedding(10_000, 8, TableSpec("int8", 0.1, "lru")).train()
    working = torch.arange(0, 10_000, 37)[:200]  # 200 rows spread over all 125 sets
    for _ in range(5):
        emb(working).sum().backward()
    stats = emb.cache_stats()
    assert stats["misses"] == 200 and stats["hits"] == 800


def test_geometry_scales_with_cache_not_table():
    spec = TableSpec("int8", 0.05)
    sets = 1_000_000 * 5 // 100 // 8  # 6250, rounded down to whole sets for 128 shards
    assert cache_geometry(1_000_000, spec) == sets - sets % 128 == 6144
    with pytest.raises(ValueError, match="cache_fraction"):
        cache_geometry(10**9, TableSpec("int8", 1e-6))


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_eviction_never_loses_an_update(precision):
    """Same SGD updates with a tiny cache (constant evictions) and a cache of every row."""
    rows, lr, grad_value = 400, 0.5, 0.01
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, rows, (64,), generator=gen) for _ in range(30)]
    counts = torch.bincount(torch.cat(batches), minlength=rows).float()
    results = {}
    for fraction in (0.02, 1.0):
        spec = TableSpec(precision, fraction, optimizer="sgd", learning_rate=lr)
        emb = MixedPrecisionEmbedding(rows, 8, spec, seed=1, init_std=0.0).train()
        for ids in batches:
            (emb(ids) * grad_value).sum().backward()
        results[fraction] = emb.dequantize_rows(torch.arange(rows))
        if fraction < 1:
            assert emb.cache_stats()["evictions"] > 100
    expected = -lr * grad_value * counts[:, None].expand(rows, 8)
    # each row is constant across columns, so quantization is exact up to the scale
    # rounding; a lost update would be off by lr * grad_value = 0.005
    for fraction, values in results.items():
        err = (values - expected).abs()
        assert err.max() < 0.0025, (fraction, err.max())
    assert (results[0.02] - results[1.0]).abs().max() < 0.0025


def test_uncached_updates_are_unbiased():
    """Many tiny updates to uncached int8 rows: SR keeps them, nearest loses them."""
    means = {}
    for sr in (True, False):
        spec = TableSpec("int8", 0.0, optimizer="sgd", learning_rate=2e-4, stochastic_rounding=sr)
        emb = MixedPrecisionEmbedding(200, 16, spec, seed=2, init_std=0.1).train()
        before = emb.dequantize_rows(torch.arange(200))[:, 0]
        for _ in range(40):
            # moves column 0 by -2e-4 per step, below half a quantization step (~8e-4)
            emb(torch.arange(200))[:, 0].sum().backward()
        means[sr] = float((emb.dequantize_rows(torch.arange(200))[:, 0] - before).mean())
    assert abs(means[True] - (-0.008)) < 0.0015, means
    assert means[False] > -0.003, means


@pytest.mark.parametrize("rows", [40, 1_000, 2_204, 5_462, 10_132, 100_000, 8_351_593])
def test_geometry_splits_into_whole_sets_for_power_of_two_shards(rows):
    """Sets round down to a multiple m of a power of two, losing under 1/8 of the cache."""
    spec = TableSpec("int8", 0.05)
    raw = max(1, int(0.05 * rows) // 8)
    sets = cache_geometry(rows, spec)
    multiple = 1
    while multiple * 2 <= min(128, raw // 8):
        multiple *= 2
    assert sets % multiple == 0 and raw - multiple < sets <= raw
    assert (raw - sets) <= raw / 8


def test_admission_count_decides_misses_once_the_set_is_full():
    # 100 rows, 10% cache: one set of 8 ways; rows 0..7 fill it (empty ways admit anyone).
    emb = MixedPrecisionEmbedding(100, 8, TableSpec("int8", 0.1, admission_count=2)).train()
    emb(torch.arange(8)).sum().backward()
    emb(torch.tensor([50, 60, 60])).sum().backward()  # 50 once: stays out; 60 twice: enters
    before = emb.cache_stats()
    emb(torch.tensor([50, 60])).sum().backward()
    after = emb.cache_stats()
    assert after["misses"] - before["misses"] == 1 and after["hits"] - before["hits"] == 1


def test_an_admission_count_above_any_batch_admits_only_into_empty_ways():
    emb = MixedPrecisionEmbedding(100, 8, TableSpec("int8", 0.1, admission_count=1 << 40)).train()
    emb(torch.arange(8)).sum().backward()  # fills the one set's 8 empty ways
    emb(torch.full((50,), 60)).sum().backward()  # 50 samples of row 60: still stays out
    before = emb.cache_stats()
    emb(torch.tensor([60])).sum().backward()
    assert emb.cache_stats()["misses"] - before["misses"] == 1
