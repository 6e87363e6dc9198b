"""The compiled serving kernels against torch's ops: the same values, bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ssl_rec.quantize.dense as dense_module
import ssl_rec.quantize.fused as fused_module
import ssl_rec.quantize.tables as tables_module
from ssl_rec.hardware import serving_kernels
from ssl_rec.models import DotInteraction
from ssl_rec.quantize import ModelBuilder, QuantizationPlan
from ssl_rec.quantize.dense import CompiledInteraction, convert_layer
from ssl_rec.quantize.tables import QuantizedTables

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
def test_table_batched_lookup_equals_torch_ops(batch, threads, simd, monkeypatch):
    tables = _tables()
    ids = _ids(tables, batch)
    ours = tables(ids)
    monkeypatch.setattr(tables_module, "serving_kernels", lambda: None)
    theirs = tables(ids)
    assert ours.shape == (batch, 8, 16) and ours.is_contiguous()
    if simd == "portable":  # INT8 rows in two roundings: FBGEMM's fma needs the x86 variants
        int8 = [f for f, p in enumerate(PRECISIONS) if p == "int8"]
        others = [f for f in range(len(PRECISIONS)) if f not in int8]
        assert torch.equal(ours[:, others], theirs[:, others])
        torch.testing.assert_close(ours[:, int8], theirs[:, int8])
    else:
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
@pytest.mark.parametrize(("n", "dim"), [(2, 4), (5, 8), (17, 16), (27, 16), (20, 32), (40, 3)])
def test_interaction_is_the_upper_triangle_summed_in_order(n, dim, threads, simd):
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


@compiled
@pytest.mark.parametrize(("batch", "dim"), [(1, 16), (300, 16), (130, 8)])
def test_lookup_and_interaction_in_one_pass(batch, dim, threads, simd):
    tables = _tables(dim)
    ids = _ids(tables, batch)
    first = torch.randn(batch, dim, generator=torch.Generator().manual_seed(2))
    out = torch.full((batch, 50), -5.0)
    tables.interaction_into(ids, first, out, 4)
    vectors = torch.cat([first[:, None], tables(ids)], 1)
    assert torch.equal(out[:, 4:40], _in_order(vectors))
    assert bool((out[:, :4] == -5.0).all()) and bool((out[:, 40:] == -5.0).all())


@compiled
def test_one_pass_refuses_bad_buffers():
    kernels = serving_kernels()
    tables = _tables()
    view, ids, first = tables._tables_view(), _ids(tables, 4), torch.randn(4, 16)
    with pytest.raises(TypeError, match="serve_interaction out must be Float"):
        kernels.serve_interaction(view, ids, first, torch.zeros(4, 40, dtype=torch.float64), 0)
    with pytest.raises(ValueError, match="36 pairs from column 5 do not fit"):
        kernels.serve_interaction(view, ids, first, torch.zeros(4, 40), 5)
    with pytest.raises(ValueError, match="from column -1"):
        kernels.serve_interaction(view, ids, first, torch.zeros(4, 40), -1)
    with pytest.raises(ValueError, match="4 samples expected"):
        kernels.serve_interaction(view, ids, first, torch.zeros(5, 40), 0)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.serve_interaction(view, ids, first, torch.zeros(40, 4).t(), 0)
    with pytest.raises(ValueError, match=r"first vectors: float32\[4, 16\] expected"):
        kernels.serve_interaction(view, ids, torch.randn(4, 8), torch.zeros(4, 40), 0)
    with pytest.raises(TypeError, match="first vectors must be Float"):
        kernels.serve_interaction(view, ids, first.double(), torch.zeros(4, 40), 0)
    shared = torch.zeros(4, 60)
    with pytest.raises(ValueError, match="must not share memory with first"):
        kernels.serve_interaction(view, ids, shared.view(-1)[:64].view(4, 16), shared, 20)
    ids[1, 3] = -1
    with pytest.raises(IndexError, match="row 1, table 3: id -1"):
        tables.interaction_into(ids, first, torch.zeros(4, 40), 0)


PLANS = {
    "fp32": ({}, {}),
    "mixed": (
        {"C0": "fp16", "C1": "int2", "C2": "int4", "C3": "int8"},
        {"encoder.bottom.0": "int8_fbgemm", "encoder.bottom.2": "bf16",
         "encoder.top.0": "int8_fbgemm", "encoder.top.2": "fp16", "head.mlp.0": "bf16"},
    ),
}  # fmt: skip


def _model(source, plan_name):
    tables, layers = PLANS[plan_name]
    plan = source.fp32_plan()
    plan = QuantizationPlan({**plan.tables, **tables}, {**plan.layers, **layers})
    return ModelBuilder(source).build(plan)


@compiled
@pytest.mark.parametrize("plan_name", list(PLANS))
@pytest.mark.parametrize("batch", [1, 5, 700])
def test_fused_forward_equals_the_concatenating_one(source, rows, plan_name, batch, threads):
    model = _model(source, plan_name)
    assert fused_module.fusable(model.dense)
    dense, sparse = rows.dense[:batch], rows.sparse[:batch]
    outside = model(dense, sparse)  # buffers made here serve inside inference mode, and back
    with torch.inference_mode():
        fused = model(dense, sparse)
        plain = model.dense(model.tables(sparse), dense).float()
        staged = fused_module.dlrm_logits(model.tables, model.dense, dense, sparse, fused=False)
    assert fused.shape == (batch,)
    assert torch.equal(fused, plain)
    assert torch.equal(fused, staged.float())
    assert torch.equal(fused, outside) and torch.equal(model(dense, sparse), fused)


@compiled
def test_fused_forward_reports_its_stages_and_reuses_its_buffers(source, rows):
    model = _model(source, "mixed")
    seen: list[str] = []
    with torch.inference_mode():
        first = model(rows.dense[:64], rows.sparse[:64])
        fused_module.dlrm_logits(model.tables, model.dense, rows.dense[64:128],
                                 rows.sparse[64:128], mark=seen.append)  # fmt: skip
        again = model(rows.dense[:64], rows.sparse[:64])
    assert seen == list(fused_module.FUSED_STAGES)
    assert torch.equal(first, again)


@compiled
def test_fused_forward_refuses_bad_input(source, rows):
    model = _model(source, "mixed")
    sparse = rows.sparse[:8].clone()
    with pytest.raises(ValueError, match="8 rows of dense features but 7 of sparse ids"):
        model(rows.dense[:8], sparse[:7])
    with pytest.raises(ValueError, match=r"the tables need \[B, 4\]"):
        model(rows.dense[:8], sparse[:, :3])
    sparse[6, 2] = 10_000
    with pytest.raises(IndexError, match="row 6, table 2: id 10000"):
        model(rows.dense[:8], sparse)


def test_hooks_and_other_encoders_take_the_module_path(source, rows):
    model = _model(source, "mixed")
    seen = []
    hook = model.dense.encoder.interaction.register_forward_hook(lambda *a: seen.append(1))
    try:
        assert not fused_module.fusable(model.dense)
        with torch.inference_mode():
            model(rows.dense[:8], rows.sparse[:8])
    finally:
        hook.remove()
    assert seen == [1]
    assert not fused_module.fusable(nn.Sequential())
    model.dense.requires_grad_(True)
    assert not fused_module.fusable(model.dense)  # the kernels record no gradient
    with torch.no_grad():
        assert fused_module.fusable(model.dense)
