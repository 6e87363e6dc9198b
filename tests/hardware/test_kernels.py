"""Compiled kernels == reference, bit for bit, with 1 and 2 threads and every SIMD variant.
The compiled path is built here and must not be skipped: a build failure fails these tests."""

import copy

import pytest
import torch

from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, Precision, TableSpec, quantize_rows
from ssl_rec.hardware.kernels import reference
from ssl_rec.hardware.kernels.dispatch import CompiledKernels, load_compiled

CARDS = [50, 30, 200, 7, 64, 40, 90, 3]
SPECS = [
    TableSpec("int8", 0.2, admission_count=1),
    TableSpec("int4", 0.3, "lfu", admission_count=3),
    TableSpec("int2", 0.1, optimizer="sgd"),
    TableSpec("fp16", 0.5),
    TableSpec("bf16", 0.2, "lfu", stochastic_rounding=False),
    TableSpec("fp32"),
    TableSpec("int8", 0.0, optimizer="sgd"),
    TableSpec("int4", 1.0, optimizer="sgd"),
]


@pytest.fixture(scope="module")
def compiled():
    return CompiledKernels(load_compiled())


def _state(t):
    return t.stores + t.cache_rows + t.cache_tags + t.cache_state + t.stats + t.momentum


def _assert_same_state(ta, tb):
    for x, y in zip(_state(ta), _state(tb), strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y)


def _batch(gen, batch, dim):
    ids = torch.stack([torch.randint(0, c, (batch,), generator=gen) for c in CARDS], 1)
    grad = torch.randn(batch, len(CARDS), dim, generator=gen)
    grad[::3, 2] = 0  # masked fields: their rows are skipped
    grad[1::4, 0] = -0.0
    return ids, grad


@pytest.mark.parametrize("dim", [8, 36, 64])
def test_compiled_matches_reference_bit_for_bit(compiled, threads, simd, dim):
    emb = MixedPrecisionEmbeddingCollection(CARDS, dim, SPECS, seed=3)
    a, b = copy.deepcopy(emb.group), copy.deepcopy(emb.group)
    gen = torch.Generator().manual_seed(dim)
    pending = []
    for step in range(5):
        ids, grad = _batch(gen, 48, dim)
        ta, tb = a.tensors(), b.tensors()
        plan_a = reference.admit(ta, ids, 3, 2 * step, pending)
        plan_b = compiled.admit(tb, ids, 3, 2 * step, pending)
        for x, y in zip(plan_a, plan_b, strict=True):
            assert torch.equal(x, y)
        assert torch.equal(reference.gather(ta, plan_a), compiled.gather(tb, plan_b))
        assert torch.equal(reference.forward(ta, ids), compiled.forward(tb, ids))
        reference.update(ta, plan_a, grad, 3, 2 * step + 1)
        compiled.update(tb, plan_b, grad, 3, 2 * step + 1)
        _assert_same_state(ta, tb)
        pending = [plan_a] if step % 2 else []  # some admissions run with locked rows
    stats = torch.stack(a.tensors().stats)
    assert int(stats[:, 2].sum()) > 0 and int(stats[:, 3].sum()) > 0  # evictions, store writes


def test_updates_find_rows_that_moved_since_their_admission(compiled):
    """An admission between a plan's admit and update (prefetch), or cache tags written in
    place (load_state_dict, load_float), may cache rows the plan read from the store or
    empty its slots: the update must look rows up again, as the reference always does."""
    emb = MixedPrecisionEmbeddingCollection(CARDS, 16, SPECS, seed=4)
    a, b = copy.deepcopy(emb.group), copy.deepcopy(emb.group)
    gen = torch.Generator().manual_seed(5)
    ta, tb = a.tensors(), b.tensors()
    for step in range(4):
        (ids1, grad1), (ids2, grad2) = _batch(gen, 64, 16), _batch(gen, 64, 16)
        p1a, p1b = reference.admit(ta, ids1, 3, 4 * step), compiled.admit(tb, ids1, 3, 4 * step)
        if step % 2:  # the next batch admitted ahead, the first plan's rows locked
            p2a = reference.admit(ta, ids2, 3, 4 * step + 1, [p1a])
            p2b = compiled.admit(tb, ids2, 3, 4 * step + 1, [p1b])
        else:  # the caches emptied in place, as load_float does
            for t in (ta, tb):
                for tags in t.cache_tags:
                    tags.fill_(-1)
        reference.update(ta, p1a, grad1, 3, 4 * step + 2)
        compiled.update(tb, p1b, grad1, 3, 4 * step + 2)
        _assert_same_state(ta, tb)
        if step % 2:
            reference.update(ta, p2a, grad2, 3, 4 * step + 3)
            compiled.update(tb, p2b, grad2, 3, 4 * step + 3)
            _assert_same_state(ta, tb)


def test_gather_and_lookup_span_sample_chunks(compiled, threads, simd):
    """Batches longer than the kernels' 256-sample chunks, hits and misses mixed in each."""
    emb = MixedPrecisionEmbeddingCollection(CARDS, 64, SPECS, seed=5)
    a, b = copy.deepcopy(emb.group), copy.deepcopy(emb.group)
    gen = torch.Generator().manual_seed(11)
    for step in range(3):
        ids, grad = _batch(gen, 700, 64)
        ta, tb = a.tensors(), b.tensors()
        plan_a = reference.admit(ta, ids, 3, 2 * step)
        plan_b = compiled.admit(tb, ids, 3, 2 * step)
        assert torch.equal(reference.gather(ta, plan_a), compiled.gather(tb, plan_b))
        assert torch.equal(reference.forward(ta, ids), compiled.forward(tb, ids))
        reference.update(ta, plan_a, grad, 3, 2 * step + 1)
        compiled.update(tb, plan_b, grad, 3, 2 * step + 1)
        _assert_same_state(ta, tb)
    hits = torch.stack(a.tensors().stats)[:, 0]
    assert int(hits.sum()) > 0


def test_rows_with_zero_gradient_are_not_rewritten(compiled):
    spec = TableSpec("int8", 0.0, optimizer="sgd")
    emb = MixedPrecisionEmbeddingCollection([100], 16, spec, seed=0)
    t = emb.group.tensors()
    before = t.stores[0].clone()
    ids = torch.arange(10).reshape(10, 1)
    plan = compiled.admit(t, ids, 0, 0)
    grad = torch.zeros(10, 1, 16)
    grad[3] = 1.0
    compiled.update(t, plan, grad, 0, 1)
    changed = (t.stores[0] != before).any(dim=1).nonzero().flatten().tolist()
    assert changed == [3] and int(t.stats[0][3]) == 1


def test_full_sets_leave_rows_uncached_and_lock_pending_rows(compiled):
    spec = TableSpec("int8", 8 / 64, optimizer="sgd", admission_count=1)  # one set of 8 ways
    emb = MixedPrecisionEmbeddingCollection([64], 8, spec, seed=0)
    t = emb.group.tensors()
    first = compiled.admit(t, torch.arange(12).reshape(12, 1), 0, 0)
    assert first.slots[0, :12].tolist() == list(range(8)) + [-1] * 4
    # the first batch still waits for its backward: its 8 rows stay, new rows are not cached
    second = compiled.admit(t, torch.arange(20, 23).reshape(3, 1), 0, 1, [first])
    assert second.slots[0, :3].tolist() == [-1, -1, -1]
    third = compiled.admit(t, torch.arange(20, 23).reshape(3, 1), 0, 2)
    slots = third.slots[0, :3].tolist()
    assert min(slots) >= 0 and len(set(slots)) == 3
    assert int(t.stats[0][2]) == 3  # three evictions, once the first batch is unlocked


@pytest.mark.parametrize(
    "bits,op",
    [
        (8, torch.ops.quantized.embedding_bag_byte_rowwise_offsets),
        (4, torch.ops.quantized.embedding_bag_4bit_rowwise_offsets),
    ],
)
@pytest.mark.parametrize("dim", [16, 32, 64, 72])
def test_bag_lookup_matches_reference_and_fbgemm(compiled, threads, simd, bits, op, dim):
    gen = torch.Generator().manual_seed(bits)
    store = quantize_rows(torch.randn(300, dim, generator=gen), f"int{bits}")
    idx = torch.randint(0, 300, (600,), generator=gen)
    offsets = torch.tensor([0, 3, 3, 50, 120, 200] + list(range(210, 601, 2)))
    ours = compiled.bag_lookup(store, bits, idx, offsets, dim)
    # Sums of up to 80 rows, fused multiply-add vs two roundings: bound the error by
    # 1e-6 relative to the sum of magnitudes, not to the (cancelling) sum itself.
    ref = reference.bag_lookup(store, bits, idx, offsets, dim)
    tol = 1e-6 * float(ref.abs().max()) * 80
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=tol)
    torch.testing.assert_close(ours, op(store, idx, offsets[:-1]), rtol=1e-6, atol=tol)


@pytest.mark.parametrize("bits", [8, 4])
def test_bag_lookup_is_the_same_with_avx2_and_avx512(compiled, bits):
    """Fused multiply-adds of 16 columns or of 8 give the same sums, bit for bit."""
    ext = compiled._ext
    if ext.max_simd_level() < 2:
        pytest.skip("this CPU has no AVX-512")
    gen = torch.Generator().manual_seed(7)
    for dim in (16, 32, 64, 128):
        store = quantize_rows(torch.randn(200, dim, generator=gen), f"int{bits}")
        idx = torch.randint(0, 200, (400,), generator=gen)
        offsets = torch.tensor([0, 0, 1, 40, 41, 41, 300, 400])
        results = []
        for level in (1, 2):
            previous = ext.set_simd_level(level)
            try:
                results.append(compiled.bag_lookup(store, bits, idx, offsets, dim))
            finally:
                ext.set_simd_level(previous)
        assert torch.equal(results[0], results[1]) and not results[1][0].any()


def test_compiled_formats_agree_with_precision(compiled):
    assert compiled._ext.num_kinds() == len(Precision)
    for p in Precision:
        for dim in (8, 12, 64):
            if dim % (1 if p.is_float else 8 // p.bits) == 0:
                assert compiled._ext.row_bytes(p.code, dim) == p.row_bytes(dim), (p, dim)
    with pytest.raises(ValueError, match="unknown format"):
        compiled._ext.row_bytes(len(Precision), 8)


@pytest.mark.parametrize("precision", ["int4", "int2"])
def test_fp16_scale_and_bias_round_alike_at_the_extremes(compiled, simd, precision):
    """Rows whose FP16 scale is subnormal (tiny ranges) or whose values approach FP16's
    largest finite value: every variant's directed FP16 rounding matches the reference."""
    gen = torch.Generator().manual_seed(5)
    magnitudes = torch.tensor([1e-7, 3e-6, 2e-5, 1.0, 1e3, 1e4])
    rows = torch.randn(6, 16, generator=gen) * magnitudes[:, None]
    spec = TableSpec(precision, 0.0, optimizer="sgd", learning_rate=1e-3)
    emb = MixedPrecisionEmbeddingCollection([6], 16, spec, seed=0)
    emb.group.tables[0].load_float(rows)
    a, b = copy.deepcopy(emb.group), copy.deepcopy(emb.group)
    ids = torch.arange(6).reshape(6, 1)
    grad = torch.randn(6, 1, 16, generator=gen) * magnitudes[:, None, None]
    ta, tb = a.tensors(), b.tensors()
    plan_a, plan_b = reference.admit(ta, ids, 0, 0), compiled.admit(tb, ids, 0, 0)
    reference.update(ta, plan_a, grad, 0, 1)
    compiled.update(tb, plan_b, grad, 0, 1)
    _assert_same_state(ta, tb)
    assert int(ta.stats[0][3]) == 6  # every row was rewritten in the store
