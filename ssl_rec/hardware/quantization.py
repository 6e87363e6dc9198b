"""Reference (de)quantization of stored rows in every :class:`Precision` format.

For integer formats ``value = q * scale + bias`` (see :mod:`ssl_rec.hardware.precision`
for the row layouts).

For 4/2-bit rows the FP16 bias is rounded down and the scale up, so every value of the row
lies inside the representable range and stochastic rounding stays unbiased.
"""

from __future__ import annotations

import torch

from ssl_rec.hardware.precision import Precision
from ssl_rec.hardware.stochastic_rounding import (
    half_round_down,
    half_round_up,
    noise_bits,
    stochastic_round_bf16,
    stochastic_round_fp16,
)

__all__ = ["dequantize_rows", "quantize_rows"]


def _scale_bias(packed: torch.Tensor, p: Precision, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    nb = p.data_bytes(dim)
    qtype = torch.float32 if p.bits == 8 else torch.float16
    raw = packed[:, nb : nb + p.qparam_bytes].clone(memory_format=torch.contiguous_format)
    sb = raw.view(qtype).to(torch.float32)
    return sb[:, 0], sb[:, 1]


def _unpack(packed: torch.Tensor, p: Precision, dim: int) -> torch.Tensor:
    """uint8[n, bytes] -> int64[n, D] quantized levels."""
    nb = p.data_bytes(dim)
    data = packed[:, :nb].to(torch.int64)
    if p.bits == 8:
        return data
    per = 8 // p.bits
    shifts = torch.arange(per, dtype=torch.int64) * p.bits
    levels = (data[:, :, None] >> shifts) & p.levels
    return levels.reshape(packed.shape[0], nb * per)[:, :dim]


def dequantize_rows(stored: torch.Tensor, precision: Precision | str, dim: int) -> torch.Tensor:
    """Stored rows to FP32.

    Args:
        stored: uint8[n, row_bytes] fused rows or float[n, D] rows.
        precision: Storage format.
        dim: Embedding dimension D.

    Returns:
        float32[n, D] computed as ``q * scale + bias`` (two roundings, no FMA).

    """
    p = Precision(precision)
    if p.is_float:
        return stored.to(torch.float32)
    scale, bias = _scale_bias(stored, p, dim)
    return _unpack(stored, p, dim).to(torch.float32) * scale[:, None] + bias[:, None]


def _scale_bias_for(x: torch.Tensor, p: Precision) -> tuple[torch.Tensor, torch.Tensor]:
    # + 0.0 turns a -0.0 extreme into +0.0: the stored bias and scale never depend on which
    # zero a reduction met first.
    lo, hi = x.min(dim=1).values + 0.0, x.max(dim=1).values + 0.0
    # A tensor divisor, not a Python scalar: torch turns division by a scalar into
    # multiplication by its reciprocal, which the compiled kernels do not do.
    levels = torch.full_like(lo, float(p.levels))
    if p.bits == 8:
        return (hi - lo) / levels, lo
    bias = half_round_down(lo)
    return half_round_up((hi - bias) / levels), bias


def _pack(q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, p: Precision) -> torch.Tensor:
    n, dim = q.shape
    if p.bits == 8:
        tail = torch.stack([scale, bias], dim=1).view(torch.uint8)
        return torch.cat([q.to(torch.uint8), tail], dim=1)
    nb, per = p.data_bytes(dim), 8 // p.bits
    padded = torch.zeros(n, nb * per, dtype=torch.int64)
    padded[:, :dim] = q
    shifts = torch.arange(per, dtype=torch.int64) * p.bits
    data = (padded.view(n, nb, per) << shifts).sum(dim=2).to(torch.uint8)
    tail = torch.stack([scale, bias], dim=1).to(torch.float16).view(torch.uint8)
    return torch.cat([data, tail], dim=1)


def quantize_rows(
    x: torch.Tensor, precision: Precision | str, rkeys: torch.Tensor | None = None
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
    p = Precision(precision)
    n, dim = x.shape
    if p is Precision.fp32:
        return x.clone()
    if p.is_float:
        if rkeys is None:
            return x.to(p.dtype)
        rbits = noise_bits(rkeys, dim)
        if p is Precision.bf16:
            return stochastic_round_bf16(x, rbits)
        return stochastic_round_fp16(x, (rbits >> 8).to(torch.float32) * (2.0**-24))
    scale, bias = _scale_bias_for(x, p)
    if rkeys is None:
        u = torch.full_like(x, 0.5)
    else:
        u = (noise_bits(rkeys, dim) >> 8).to(torch.float32) * (2.0**-24)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.floor((x - bias[:, None]) / safe[:, None] + u)
    q = torch.where(scale[:, None] > 0, q, torch.zeros_like(q))
    q = q.clamp(0, p.levels).to(torch.int64)
    return _pack(q, scale, bias, p)
