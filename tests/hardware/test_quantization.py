import pytest
import torch

from ssl_rec.hardware import Precision, TableSpec, dequantize_rows, quantize_rows
from ssl_rec.hardware.stochastic_rounding import (
    half_round_down,
    half_round_up,
    row_keys,
    stream_key,
)

FBGEMM_OPS = {
    "int8": torch.ops.quantized.embedding_bag_byte_rowwise_offsets,
    "int4": torch.ops.quantized.embedding_bag_4bit_rowwise_offsets,
    "int2": torch.ops.quantized.embedding_bag_2bit_rowwise_offsets,
}


@pytest.mark.parametrize("precision", ["int8", "int4", "int2"])
@pytest.mark.parametrize("stochastic", [False, True])
def test_packed_rows_are_fbgemm_inputs(precision, stochastic):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 16, generator=gen) * 0.3
    rk = row_keys(stream_key(1, 0, 0, 0), torch.arange(64)) if stochastic else None
    packed = quantize_rows(w, precision, rk)
    assert packed.shape == (64, Precision(precision).row_bytes(16))
    idx = torch.randint(0, 64, (48,), generator=gen)
    offsets = torch.arange(0, 48, 4)
    ours = torch.zeros(12, 16).index_add_(
        0, torch.arange(48) // 4, dequantize_rows(packed, precision, 16)[idx]
    )
    torch.testing.assert_close(
        FBGEMM_OPS[precision](packed, idx, offsets), ours, rtol=1e-6, atol=1e-6
    )


def test_int8_matches_fbgemm_prepack_layout():
    w = torch.randn(8, 16)
    theirs = torch.ops.quantized.embedding_bag_byte_prepack(w)
    ours = quantize_rows(w, "int8")
    torch.testing.assert_close(
        dequantize_rows(theirs, "int8", 16), dequantize_rows(ours, "int8", 16), atol=2e-2, rtol=0
    )
    # scale and bias live in the same bytes
    torch.testing.assert_close(
        theirs[:, 16:].view(torch.float32), ours[:, 16:].view(torch.float32), atol=1e-6, rtol=1e-4
    )


@pytest.mark.parametrize("precision", ["int8", "int4", "int2", "fp16", "bf16"])
def test_stochastic_rounding_is_unbiased(precision):
    w = torch.randn(32, 16, generator=torch.Generator().manual_seed(1))
    draws = 400
    acc = torch.zeros_like(w)
    for step in range(draws):
        rk = row_keys(stream_key(7, 3, 0, step), torch.arange(32))
        acc += dequantize_rows(quantize_rows(w, precision, rk), precision, 16)
    mean = acc / draws
    # per-element rounding error is at most one step; its mean shrinks like step / sqrt(draws)
    nearest = dequantize_rows(quantize_rows(w, precision), precision, 16)
    step = (nearest - w).abs().amax(dim=1, keepdim=True) * 2 + 1e-12
    z = ((mean - w) / (step / draws**0.5)).abs()
    assert z.mean() < 0.6, z.mean()
    # and the bias is far below what round-to-nearest leaves
    assert (mean - w).abs().mean() < 0.25 * (nearest - w).abs().mean()


def test_stochastic_rounding_is_deterministic_per_seed():
    w = torch.randn(16, 8)
    rk = row_keys(stream_key(5, 0, 0, 9), torch.arange(16))
    a = quantize_rows(w, "int4", rk)
    b = quantize_rows(w, "int4", rk.clone())
    c = quantize_rows(w, "int4", row_keys(stream_key(6, 0, 0, 9), torch.arange(16)))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_half_directed_rounding():
    x = torch.tensor([0.1, -0.1, 1e-9, -1e-9, 0.0, 3.0, -65024.0])
    down, up = half_round_down(x), half_round_up(x)
    assert bool((down <= x).all()) and bool((up >= x).all())
    assert torch.equal(down[5:], x[5:])


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(precision="int3"),
        dict(cache_fraction=1.5),
        dict(cache_policy="fifo"),
        dict(optimizer="adam"),
        dict(learning_rate=0.0),
        dict(eps=-1.0),
        dict(admission_count=0),
        dict(admission_count=2.5),
        dict(admission_count=True),
    ],
)
def test_table_spec_rejects_bad_values(kwargs):
    key = next(iter(kwargs))
    with pytest.raises(ValueError, match=key):
        TableSpec(**kwargs)


def test_table_spec_is_a_yaml_type():
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--tables", type=list[TableSpec])
    cfg = parser.parse_string("tables: [{precision: int4, cache_fraction: 0.01}, {}]")
    specs = parser.instantiate(cfg).tables
    assert specs == [TableSpec("int4", 0.01), TableSpec()]
