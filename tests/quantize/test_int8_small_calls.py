"""FBGEMM's INT8 Linear layer on a few rows: the FP32 product of its dequantized weights
(no input quantization), and FBGEMM's integer product above ``SMALL_PRODUCT``."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from ssl_rec.quantize.fbgemm_linear import SMALL_PRODUCT, FbgemmInt8Linear

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
        assert torch.equal(layer(x), expected)
        with torch.inference_mode():  # as served
            assert torch.equal(layer(x), expected)


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
