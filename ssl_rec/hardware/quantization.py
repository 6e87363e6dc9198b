"""Row formats of the low-precision store and their reference (de)quantization.

Integer formats are FBGEMM's fused row-wise asymmetric rows (as produced by
``torch.ops.quantized.embedding_bag_byte_prepack`` / ``embedding_bag_4bit_prepack``): each
uint8 row holds the packed values (low bits first for 4/2-bit), then the row's scale and
bias, FP32 for 8-bit and FP16 for 4/2-bit, and ``value = q * scale + bias``.
Float formats (fp32/fp16/bf16) are plain ``[R, D]`` tensors of that dtype.

For 4/2-bit rows the FP16 bias is rounded down and the scale up, so every value of the row
lies inside the representable range and stochastic rounding stays unbiased.
"""

from __future__ import annotations

import torch

from ssl_rec.hardware.stochastic_rounding import (
    half_round_down,
    half_round_up,
    noise_bits,
    stochastic_round_bf16,
    stochastic_round_fp16,
)

KIND_CODES: dict[str, int] = {"fp32": 0, "fp16": 1, "bf16": 2, "int8": 3, "int4": 4, "int2": 5}
BITS: dict[str, int] = {"int8": 8, "int4": 4, "int2": 2}
FLOAT_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}

__all__ = ["BITS", "KIND_CODES", "dequantize_rows", "quantize_rows", "row_bytes", "store_shape"]


def _data_bytes(bits: int, dim: int) -> int:
    per = 8 // bits
    return (dim + per - 1) // per


def row_bytes(precision: str, dim: int) -> int:
    """Bytes of one stored row, scale and bias included.

    Args:
        precision: One of ``fp32 | fp16 | bf16 | int8 | int4 | int2``.
        dim: Embedding dimension D.

    Returns:
        Bytes per row, e.g. ``D + 8`` for int8 and ``D / 2 + 4`` for int4.

    """
    if precision in FLOAT_DTYPES:
        return dim * FLOAT_DTYPES[precision].itemsize
    if precision not in BITS:
        raise ValueError(f"precision={precision!r} is not one of {list(KIND_CODES)}")
    return _data_bytes(BITS[precision], dim) + (8 if precision == "int8" else 4)


def store_shape(precision: str, rows: int, dim: int) -> tuple[tuple[int, int], torch.dtype]:
    """Shape and dtype of a store: ``([R, D], float)`` or ``([R, row_bytes], uint8)``."""
    if precision in FLOAT_DTYPES:
        return (rows, dim), FLOAT_DTYPES[precision]
    return (rows, row_bytes(precision, dim)), torch.uint8


def _scale_bias(packed: torch.Tensor, bits: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    nb = _data_bytes(bits, dim)
    if bits == 8:
        sb = packed[:, nb : nb + 8].contiguous().view(torch.float32)
        return sb[:, 0], sb[:, 1]
    sb = packed[:, nb : nb + 4].contiguous().view(torch.float16).to(torch.float32)
    return sb[:, 0], sb[:, 1]


def _unpack(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """uint8[n, bytes] -> int64[n, D] quantized levels."""
    nb = _data_bytes(bits, dim)
    data = packed[:, :nb].to(torch.int64)
    if bits == 8:
        return data
    per = 8 // bits
    shifts = torch.arange(per, dtype=torch.int64) * bits
    levels = (data[:, :, None] >> shifts) & ((1 << bits) - 1)
    return levels.reshape(packed.shape[0], nb * per)[:, :dim]


def dequantize_rows(stored: torch.Tensor, precision: str, dim: int) -> torch.Tensor:
    """Stored rows to FP32.

    Args:
        stored: uint8[n, row_bytes] fused rows or float[n, D] rows.
        precision: Storage format.
        dim: Embedding dimension D.

    Returns:
        float32[n, D] computed as ``q * scale + bias`` (two roundings, no FMA).

    """
    if precision in FLOAT_DTYPES:
        return stored.to(torch.float32)
    bits = BITS[precision]
    scale, bias = _scale_bias(stored, bits, dim)
    return _unpack(stored, bits, dim).to(torch.float32) * scale[:, None] + bias[:, None]


def _scale_bias_for(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    lo, hi = x.min(dim=1).values, x.max(dim=1).values
    # A tensor divisor, not a Python scalar: torch turns division by a scalar into
    # multiplication by its reciprocal, which the compiled kernels do not do.
    levels = torch.full_like(lo, float((1 << bits) - 1))
    if bits == 8:
        return (hi - lo) / levels, lo
    bias = half_round_down(lo)
    return half_round_up((hi - bias) / levels), bias


def _pack(q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, bits: int) -> torch.Tensor:
    n, dim = q.shape
    nb = _data_bytes(bits, dim)
    if bits == 8:
        tail = torch.stack([scale, bias], dim=1).view(torch.uint8)
        return torch.cat([q.to(torch.uint8), tail], dim=1)
    per = 8 // bits
    padded = torch.zeros(n, nb * per, dtype=torch.int64)
    padded[:, :dim] = q
    shifts = torch.arange(per, dtype=torch.int64) * bits
    data = (padded.view(n, nb, per) << shifts).sum(dim=2).to(torch.uint8)
    tail = torch.stack([scale, bias], dim=1).to(torch.float16).view(torch.uint8)
    return torch.cat([data, tail], dim=1)


def quantize_rows(
    x: torch.Tensor, precision: str, rkeys: torch.Tensor | None = None
) -> torch.Tensor:
    """FP32 rows to the stored format, to nearest or stochastically.

    Args:
        x: float32[n, D] rows.
        precision: Storage format.
        rkeys: int64[n] row keys (see ``stochastic_rounding.row_keys``) for stochastic
            rounding; ``None`` rounds to nearest.

    Returns:
        uint8[n, row_bytes] fused rows, or float[n, D] for float formats.

    """
    n, dim = x.shape
    if precision == "fp32":
        return x.clone()
    if precision in ("fp16", "bf16"):
        if rkeys is None:
            return x.to(FLOAT_DTYPES[precision])
        rbits = noise_bits(rkeys, dim)
        if precision == "bf16":
            return stochastic_round_bf16(x, rbits)
        return stochastic_round_fp16(x, (rbits >> 8).to(torch.float32) * (2.0**-24))
    bits = BITS[precision]
    scale, bias = _scale_bias_for(x, bits)
    if rkeys is None:
        u = torch.full_like(x, 0.5)
    else:
        u = (noise_bits(rkeys, dim) >> 8).to(torch.float32) * (2.0**-24)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.floor((x - bias[:, None]) / safe[:, None] + u)
    q = torch.where(scale[:, None] > 0, q, torch.zeros_like(q))
    q = q.clamp(0, (1 << bits) - 1).to(torch.int64)
    return _pack(q, scale, bias, bits)
