"""FBGEMM's INT8 Linear layer on a few rows: the FP32 product of its dequantized weights
(no input quantization), and FBGEMM's integer product above ``SMALL_PRODUCT``."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from ssl_rec.hardware import serving_kernels
from ssl_rec.quantize.fbgemm_linear import SMALL_PRODUCT, FbgemmInt8Linear, _one_row_kernel

K, N = 64, 32


def _layer(relu: bool, bias: bool = True, seed: int = 0) -> FbgemmInt8Linear:
    torch.manual_seed(seed)
    return FbgemmInt8Linear.from_float(nn.Linear(K, N, bias=bias), relu)


@pytest.mark.parametrize(("relu", "bias"), [(False, True), (True, True), (False, False)])
def test_a_few_rows_get_the_fp32_product_of_the_int8_weights(relu: bool, bias: bool) -> None:
    layer = _layer(relu, bias)
    for rows in (1, 3):
        x = torch.randn(rows, K)
        expected = nn.functional.linear(x, layer.dequantized_weight(), layer.bias)
        expected = expected.relu() if relu else expected
        one_row = _one_row_kernel()
        if rows == 1 and one_row is not None:
            # one row: the compiled int8_linear, the same product summed in another order
            torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-6)
            assert torch.equal(layer(x), one_row(x, layer.weight, layer.scale, layer.bias, relu))
            continue
        assert torch.equal(layer(x), expected)
        with torch.inference_mode():  # as served
            assert torch.equal(layer(x), expected)


def test_one_row_without_the_compiled_kernels_takes_the_fp32_product(monkeypatch) -> None:
    import ssl_rec.quantize.fbgemm_linear as module

    layer = _layer(relu=True)
    x = torch.randn(1, K)
    monkeypatch.setattr(module, "_one_row_kernel", lambda: None)
    expected = nn.functional.linear(x, layer.dequantized_weight(), layer.bias).relu()
    assert torch.equal(layer(x), expected)
    assert torch.equal(layer(x[0]), expected[0])  # a 1-d row too


@pytest.mark.parametrize("level", ["portable", "avx2", "avx512"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_int8_linear_kernel_is_the_product_of_the_int8_weights(level: str, rows: int) -> None:
    from ssl_rec.hardware.kernels.dispatch import SIMD_LEVELS, load_compiled

    ext = load_compiled()
    if SIMD_LEVELS[level] > ext.max_simd_level():
        pytest.skip(f"this CPU has no {level}")
    kernels = serving_kernels()
    previous = ext.set_simd_level(SIMD_LEVELS[level])
    try:
        for k, n in ((415, 37), (16, 8), (7, 3)):  # tails of 16 and of 8 lanes, few outputs
            torch.manual_seed(k + rows)
            weight = torch.randint(-127, 128, (n, k), dtype=torch.int8)
            scale, bias = torch.rand(n) / 100, torch.randn(n)
            x = torch.randn(rows, k)
            w = weight.double() * scale.double()[:, None]
            exact = x.double() @ w.T
            # float32 summation of k terms: within k * 2^-24 of the terms' absolute sum
            bound = k * 2.0**-24 * (x.double().abs() @ w.abs().T) + 1e-6
            for b, relu in ((bias, False), (bias, True), (None, False)):
                want = exact + (0 if b is None else b.double())
                want = want.clamp_min(0) if relu else want
                got = kernels.int8_linear(x, weight, scale, b, relu)
                assert got.shape == (rows, n) and got.dtype == torch.float32
                assert bool(((got.double() - want).abs() <= bound).all())
    finally:
        ext.set_simd_level(previous)


def test_int8_linear_kernel_rejects_bad_inputs() -> None:
    kernels = serving_kernels()
    if kernels is None:
        pytest.skip("the compiled kernels are not built here")
    weight, scale = torch.zeros(4, 8, dtype=torch.int8), torch.ones(4)
    with pytest.raises(ValueError, match="must have 8 columns"):
        kernels.int8_linear(torch.zeros(1, 7), weight, scale)
    with pytest.raises(TypeError, match="weight must be Char"):
        kernels.int8_linear(torch.zeros(1, 8), weight.float(), scale)
    with pytest.raises(ValueError, match="scale must have shape"):
        kernels.int8_linear(torch.zeros(1, 8), weight, torch.ones(3))


def test_a_large_batch_gets_fbgemms_integer_product() -> None:
    layer = _layer(relu=False)
    rows = SMALL_PRODUCT // (K * N) + 1  # the first batch size past the threshold
    x = torch.randn(rows, K)
    exact = nn.functional.linear(x, layer.dequantized_weight(), layer.bias)
    out = layer(x)
    assert torch.equal(out, torch.ops.quantized.linear_dynamic(x, layer._pack(), True))
    rel = float((out - exact).norm() / exact.norm())
    assert 0 < rel < 0.02  # the activations' 7-bit quantization, and nothing else
    fewer = x[: rows - 1]  # one row fewer: the FP32 product
    expected = nn.functional.linear(fewer, layer.dequantized_weight(), layer.bias)
    assert torch.equal(layer(fewer), expected)


def test_small_calls_follow_loaded_weights_and_copies() -> None:
    layer, other = _layer(relu=True, seed=0), _layer(relu=True, seed=1)
    x = torch.randn(2, K)
    before = layer(x)  # keeps the dequantized weights
    buffer = io.BytesIO()
    torch.save(other.state_dict(), buffer)
    buffer.seek(0)
    layer.load_state_dict(torch.load(buffer, weights_only=True))
    assert torch.equal(layer(x), other(x))
    assert not torch.equal(layer(x), before)
    clone = copy.deepcopy(layer)
    assert clone._float_weight is None  # copies rebuild it, as they repack
    assert torch.equal(clone(x), layer(x))
    assert "_float_weight" not in dict(layer.state_dict())  # not saved: no stored bytes
