import copy
import importlib.util
import io
import warnings

import pytest
import torch
from torch import nn

from ssl_rec.models.numeric_encoding import DenseStandardizer
from ssl_rec.quantize import (
    ModelBuilder,
    QuantizationPlan,
    load_quantized,
    logits_of,
    quantize_ctr,
    save_quantized,
    search_plan,
)
from ssl_rec.quantize.fbgemm_linear import LARGE_ROWS, WIDE_OUTPUT, FbgemmInt8Linear, _amx_int8
from ssl_rec.quantize.quantization_plan import DENSE_LADDER, Unit
from ssl_rec.quantize.search import ladder_of


def test_fused_relu_is_the_relu_of_the_output():
    torch.manual_seed(2)
    linear, x = nn.Linear(32, 16), torch.randn(64, 32)
    plain, fused = FbgemmInt8Linear.from_float(linear), FbgemmInt8Linear.from_float(linear, True)
    assert torch.equal(fused(x), torch.relu(plain(x)))


@pytest.mark.parametrize("bias", [True, False])
def test_fbgemm_layer_computes_the_int8_product(bias):
    torch.manual_seed(0)
    linear = nn.Linear(48, 24, bias=bias)
    layer = FbgemmInt8Linear.from_float(linear)
    assert layer.weight.dtype == torch.int8
    assert int(layer.weight.abs().amax(dim=1).min()) == 127  # every row uses its full range
    x = torch.randn(2048, 48).relu()  # above SMALL_PRODUCT: FBGEMM's integer product
    expected = nn.functional.linear(x, layer.dequantized_weight(), linear.bias)
    out = layer(x)
    # only the activations' per-batch 7-bit quantization separates the two
    rel = (out - expected).norm() / expected.norm()
    assert 0 < rel < 0.02
    assert (out - linear(x)).norm() / linear(x).norm() < 0.03


def test_fbgemm_layer_state_loads_weights_only_and_copies():
    torch.manual_seed(1)
    layer = FbgemmInt8Linear.from_float(nn.Linear(16, 8))
    x = torch.randn(32, 16)
    buffer = io.BytesIO()
    torch.save(layer.state_dict(), buffer)
    buffer.seek(0)
    fresh = FbgemmInt8Linear(16, 8)
    fresh(x)  # packed from its zero weights: loading must repack
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    assert torch.equal(fresh(x), layer(x))
    assert torch.equal(copy.deepcopy(layer)(x), layer(x))


def test_fbgemm_layer_is_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FbgemmInt8Linear.from_float(nn.Linear(4, 2))(torch.zeros(1, 4))


def test_fbgemm_layers_round_trip_through_the_quantized_directory(source, rows, tmp_path):
    plan = source.fp32_plan()
    layers = {k: "fp32" if k.endswith("interaction") else "int8_fbgemm" for k in plan.layers}
    plan = QuantizationPlan(dict.fromkeys(plan.tables, "int8"), layers)
    model = ModelBuilder(source).build(plan)
    # the ReLU after each hidden layer runs in FBGEMM's output stage
    assert model.layer("encoder.top.0").layer.relu
    assert isinstance(model.dense.get_submodule("encoder.top.1"), nn.Identity)
    assert not model.layer("head.mlp.0").layer.relu
    save_quantized(model, tmp_path / "q", {})
    loaded = load_quantized(tmp_path / "q")
    assert loaded.plan == plan
    assert isinstance(loaded.layer("encoder.top.0").layer, FbgemmInt8Linear)
    assert loaded.layer("encoder.top.0").layer.relu
    assert torch.equal(logits_of(loaded, rows), logits_of(model, rows))
    assert loaded.nbytes() == model.nbytes()


def test_quantize_ctr_with_fbgemm_layers_is_smaller_and_within_budget(source, rows):
    model, report = quantize_ctr(source, rows, rows, 1e-2, tiny_rows=3, tiny_weights=0)
    chosen = {v for k, v in report["choices"]["layers"].items() if "interaction" not in k}
    assert chosen == {"int8_fbgemm"}
    assert abs(report["calibration_set"]["ne_quantized"] - report["ne_fp32"]) <= 1e-2
    linears = [m for m in source.dense.modules() if isinstance(m, nn.Linear)]
    # 1 byte per weight, a float32 scale and bias per output; plus the dense columns'
    # training mean and std (float32 buffers of the standardizer), kept as they are
    expected = sum(m.out_features * (m.in_features + 8) for m in linears)
    expected += sum(
        b.numel() * b.element_size()
        for m in source.dense.modules()
        if isinstance(m, DenseStandardizer)
        for b in m.buffers()
    )
    assert report["bytes"]["quantized"]["dense"] == expected


def test_without_torchao_the_ladder_keeps_the_fbgemm_layer(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a)
    )
    ladder = ladder_of(Unit("layer", "encoder.top.0"), 0, 8, 128)
    assert ladder == (DENSE_LADDER[0], ("int8_fbgemm",))


def test_a_layer_that_cannot_take_a_precision_takes_the_next_choice(source, rows, monkeypatch):
    import ssl_rec.quantize.model as model_module

    real = model_module.convert_layer

    def refuse(layer, precision, relu=False):
        if precision == "int8_fbgemm" and layer.in_features == 2:  # the bottom's first layer
            raise RuntimeError("shape '[16, 1]' is invalid")
        return real(layer, precision, relu)

    monkeypatch.setattr(model_module, "convert_layer", refuse)
    result = search_plan(ModelBuilder(source), rows, 10.0, tiny_rows=3, tiny_weights=0)
    assert result.plan.layers["encoder.bottom.0"] == "int8_weight_only"
    assert result.plan.layers["encoder.top.0"] == "int8_fbgemm"
    refused = [s for s in result.steps if s.unit == "layer encoder.bottom.0" and not s.accepted]
    assert [s.precision for s in refused] == ["int8_fbgemm"]
    assert refused[0].ne is None


@pytest.mark.parametrize("relu", [False, True])
def test_large_calls_compute_the_fbgemm_product(relu):
    torch.manual_seed(3)
    layer = FbgemmInt8Linear.from_float(nn.Linear(40, WIDE_OUTPUT), relu)
    x = torch.randn(LARGE_ROWS, 40).relu()
    out = layer(x)
    uses_amx = layer._packed_amx is not None
    assert uses_amx == _amx_int8()  # oneDNN's packing exactly where the CPU has AMX
    op = torch.ops.quantized.linear_relu_dynamic if relu else torch.ops.quantized.linear_dynamic
    fbgemm = op(x, layer._pack("fbgemm"), True)
    # the same 7-bit activations and INT8 weights: only the dequantization's rounding differs
    torch.testing.assert_close(out, fbgemm, rtol=1e-5, atol=1e-5)
    assert torch.equal(layer(x[: LARGE_ROWS - 1]), op(x[: LARGE_ROWS - 1], layer._packed, True))
    assert copy.deepcopy(layer)._packed_amx is None  # repacked lazily, like the FBGEMM one
