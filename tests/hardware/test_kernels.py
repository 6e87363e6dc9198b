"""Compiled kernels == reference. The compiled path is built here and must not be skipped:
a build failure fails these tests."""

import copy

import pytest
import torch

from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, Precision, TableSpec, quantize_rows
from ssl_rec.hardware.kernels import reference
from ssl_rec.hardware.kernels.dispatch import CompiledKernels, get_kernels, load_compiled

CARDS = [50, 30, 200, 7, 64, 40, 90]
SPECS = [
    TableSpec("int8", 0.2),
    TableSpec("int4", 0.3, "lfu"),
    TableSpec("int2", 0.1, optimizer="sgd"),
    TableSpec("fp16", 0.5),
    TableSpec("bf16", 0.2, "lfu", stochastic_rounding=False),
    TableSpec("fp32"),
    TableSpec("int8", 0.0, optimizer="sgd"),
]


@pytest.fixture(scope="module")
def compiled():
    return CompiledKernels(load_compiled())


def _state(t):
    return t.stores + t.cache_rows + t.cache_tags + t.cache_state + t.stats + t.momentum


def test_compiled_formats_agree_with_precision(compiled):
    assert compiled._ext.num_kinds() == len(Precision)
    for p in Precision:
        for dim in (8, 12, 64):
            if dim % (1 if p.is_float else 8 // p.bits) == 0:
                assert compiled._ext.row_bytes(p.code, dim) == p.row_bytes(dim), (p, dim)
    with pytest.raises(RuntimeError, match="unknown format"):
        compiled._ext.row_bytes(len(Precision), 8)


def test_compiled_matches_reference_over_training_steps(compiled):
    emb = MixedPrecisionEmbeddingCollection(CARDS, 8, SPECS, seed=3)
    a, b = copy.deepcopy(emb.group), copy.deepcopy(emb.group)
    gen = torch.Generator().manual_seed(0)
    for step in range(4):
        ids = torch.stack([torch.randint(0, c, (48,), generator=gen) for c in CARDS], 1)
        grad = torch.randn(48, len(CARDS), 8, generator=gen)
        ta, tb = a.tensors(), b.tensors()
        out_a, slots_a = reference.train_forward(ta, ids, 3, step)
        out_b, slots_b = compiled.train_forward(tb, ids, 3, step)
        torch.testing.assert_close(out_b, out_a, rtol=1e-6, atol=0)
        assert torch.equal(slots_a, slots_b)
        torch.testing.assert_close(
            compiled.forward(tb, ids), reference.forward(ta, ids), rtol=1e-6, atol=0
        )
        reference.update(ta, ids, grad, 3, step, slots_a)
        compiled.update(tb, ids, grad, 3, step, slots_b)
        for x, y in zip(_state(ta), _state(tb), strict=True):
            if x.is_floating_point():
                torch.testing.assert_close(y, x, rtol=1e-6, atol=0)
            else:
                assert torch.equal(x, y)  # integer stores, tags, counters: exactly
    assert int(sum(s[2] for s in a.tensors().stats)) > 0  # evictions were exercised


@pytest.mark.parametrize(
    "bits,op",
    [
        (8, torch.ops.quantized.embedding_bag_byte_rowwise_offsets),
        (4, torch.ops.quantized.embedding_bag_4bit_rowwise_offsets),
    ],
)
def test_bag_lookup_matches_reference_and_fbgemm(compiled, bits, op):
    gen = torch.Generator().manual_seed(bits)
    store = quantize_rows(torch.randn(300, 32, generator=gen), f"int{bits}")
    idx = torch.randint(0, 300, (200,), generator=gen)
    offsets = torch.tensor([0, 3, 3, 50, 120, 200])
    ours = compiled.bag_lookup(store, bits, idx, offsets, 32)
    # Sums of up to 80 rows, fused multiply-add vs two roundings: bound the error by
    # 1e-6 relative to the sum of magnitudes, not to the (cancelling) sum itself.
    ref = reference.bag_lookup(store, bits, idx, offsets, 32)
    magnitude = reference.bag_lookup(store, bits, idx, offsets, 32).abs().max() * 80
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6 * float(magnitude))
    torch.testing.assert_close(
        ours, op(store, idx, offsets[:-1]), rtol=1e-6, atol=1e-6 * float(magnitude)
    )


def test_dispatch_env(monkeypatch):
    monkeypatch.setenv("SSL_REC_KERNELS", "reference")
    assert get_kernels() is reference
    monkeypatch.setenv("SSL_REC_KERNELS", "compiled")
    assert isinstance(get_kernels(), CompiledKernels)
    monkeypatch.setenv("SSL_REC_KERNELS", "fast")
    with pytest.raises(ValueError, match="SSL_REC_KERNELS"):
        get_kernels()
