"""The compiled serving kernels against torch's ops: the same values, bit for bit."""

from __future__ import annotations

import pytest
import torch

import ssl_rec.quantize.dense as dense_module
import ssl_rec.quantize.tables as tables_module
from ssl_rec.hardware import serving_kernels
from ssl_rec.models import DotInteraction
from ssl_rec.quantize.dense import CompiledInteraction, convert_layer
from ssl_rec.quantize.tables import QuantizedTables


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    """Intra-op threads for the test (the kernels split samples across them)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


compiled = pytest.mark.skipif(serving_kernels() is None, reason="compiled kernels unavailable")
PRECISIONS = ["fp32", "fp16", "bf16", "int8", "int4", "int2", "int8", "fp16"]


def _tables(dim: int = 16) -> QuantizedTables:
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(50 + 30 * f, dim, generator=gen) * (f + 1) for f in range(8)]
    return QuantizedTables.from_float(weights, PRECISIONS)


def _ids(tables: QuantizedTables, batch: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.stack([torch.randint(0, c, (batch,), generator=gen)
                        for c in tables.cardinalities], 1)  # fmt: skip


@compiled
@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_table_batched_lookup_equals_torch_ops(batch, threads, monkeypatch):
    tables = _tables()
    ids = _ids(tables, batch)
    ours = tables(ids)
    monkeypatch.setattr(tables_module, "serving_kernels", lambda: None)
    theirs = tables(ids)
    assert ours.shape == (batch, 8, 16) and ours.is_contiguous()
    assert torch.equal(ours, theirs)


@compiled
def test_lookup_follows_a_replaced_store():
    tables, other = _tables(), _tables()
    with torch.no_grad():
        other.store_int2.copy_(torch.flip(other.store_int2, [0]))
    ids = _ids(tables, 64)
    before = tables(ids)
    tables.load_state_dict(other.state_dict(), assign=True)
    assert torch.equal(tables(ids), other(ids))
    assert not torch.equal(tables(ids), before)


@compiled
def test_lookup_names_a_bad_id():
    tables = _tables()
    ids = _ids(tables, 4)
    ids[2, 5] = tables.cardinalities[5]
    with pytest.raises(IndexError, match="row 2, table 5"):
        tables(ids)


def _in_order(vectors: torch.Tensor) -> torch.Tensor:
    """Upper-triangle dot products, each summed over d in order in FP32 (the kernel's sums)."""
    rows, cols = torch.triu_indices(vectors.shape[1], vectors.shape[1], offset=1)
    a, b = vectors[:, rows], vectors[:, cols]
    out = a[..., 0] * b[..., 0]
    for d in range(1, vectors.shape[2]):
        out = out + a[..., d] * b[..., d]
    return out


@compiled
@pytest.mark.parametrize(("n", "dim"), [(2, 4), (5, 8), (17, 16), (27, 16), (40, 3)])
def test_interaction_is_the_upper_triangle_summed_in_order(n, dim, threads):
    vectors = torch.randn(300, n, dim, generator=torch.Generator().manual_seed(n))
    ours = CompiledInteraction(n)(vectors)
    assert torch.equal(ours, _in_order(vectors))
    torch.testing.assert_close(ours, DotInteraction(n)(vectors))


@compiled
def test_interaction_rejects_bad_vectors():
    kernels = serving_kernels()
    with pytest.raises(TypeError, match="interaction vectors must be Float"):
        kernels.interaction(torch.zeros(4, 3, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="3 dimensions"):
        kernels.interaction(torch.zeros(4, 3))


def test_interaction_falls_back_to_torch(monkeypatch):
    layer = convert_layer(DotInteraction(6), "fp32")
    vectors = torch.randn(10, 6, 4)
    monkeypatch.setattr(dense_module, "serving_kernels", lambda: None)
    torch.testing.assert_close(layer(vectors), DotInteraction(6)(vectors))
    grad = vectors.clone().requires_grad_(True)
    layer(grad).sum().backward()  # the torch path keeps autograd
    assert grad.grad is not None
