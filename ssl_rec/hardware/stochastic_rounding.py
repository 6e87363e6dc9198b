"""Counter-based random numbers and stochastic rounding (reference implementation).

Stochastic rounding (SR) rounds ``x`` up with probability equal to its distance from the
lower neighbour, so ``E[round(x)] = x``: small optimizer updates survive on average instead
of vanishing under round-to-nearest (Gupta et al., 2015, https://arxiv.org/abs/1502.02551).

Noise comes from a stateless hash (Wellons' ``lowbias32``; the counter-based idea of
Philox, Salmon et al., 2011) keyed by ``(seed, stream, purpose, step, row, column)``, so the
pure-torch reference and the compiled kernels draw bit-identical numbers in any order.
All arithmetic is on 32-bit words, held in ``int64`` tensors and masked after each step.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
PURPOSE_UPDATE = 0
PURPOSE_EVICT = 1

__all__ = [
    "PURPOSE_EVICT",
    "PURPOSE_UPDATE",
    "mix32",
    "noise_bits",
    "row_keys",
    "stream_key",
    "stochastic_round_bf16",
    "stochastic_round_fp16",
    "uniform_noise",
]


def _mix32_int(x: int) -> int:
    x &= MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def mix32(x: torch.Tensor) -> torch.Tensor:
    """Hash 32-bit words (``lowbias32``).

    Args:
        x: int64[...] with values in ``[0, 2**32)``.

    Returns:
        int64[...] hashed words in ``[0, 2**32)``.

    """
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def stream_key(seed: int, stream: int, purpose: int, step: int) -> int:
    """Key of one (seed, table stream, purpose, step) draw; purpose 0 = update, 1 = eviction.

    Args:
        seed: User seed.
        stream: Table stream id (global table index).
        purpose: ``PURPOSE_UPDATE`` or ``PURPOSE_EVICT``.
        step: Training step counter of the table.

    Returns:
        A 32-bit key.

    """
    key = _mix32_int((seed & MASK32) ^ _mix32_int(stream * 2 + purpose))
    return _mix32_int(key + (step & MASK32))


def row_keys(key: int, rows: torch.Tensor) -> torch.Tensor:
    """Per-row keys.

    Args:
        key: Stream key from :func:`stream_key`.
        rows: int64[n] global row ids.

    Returns:
        int64[n] 32-bit row keys.

    """
    return mix32(key ^ mix32(rows & MASK32))


def noise_bits(rkeys: torch.Tensor, dim: int) -> torch.Tensor:
    """Random 32-bit words, one per element.

    Args:
        rkeys: int64[n] row keys from :func:`row_keys`.
        dim: Number of columns D.

    Returns:
        int64[n, D] in ``[0, 2**32)``.

    """
    cols = torch.arange(dim, dtype=torch.int64, device=rkeys.device)
    return mix32((rkeys[:, None] + cols[None, :]) & MASK32)


def uniform_noise(rkeys: torch.Tensor, dim: int) -> torch.Tensor:
    """Uniform noise in ``[0, 1)`` with 24 random bits per element.

    Args:
        rkeys: int64[n] row keys from :func:`row_keys`.
        dim: Number of columns D.

    Returns:
        float32[n, D].

    """
    return (noise_bits(rkeys, dim) >> 8).to(torch.float32) * (2.0**-24)


def _half_step(bits: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Next fp16 bit pattern towards +inf (``up``) or -inf, on int32 bit patterns."""
    neg = bits >= 0x8000
    mag = bits & 0x7FFF
    towards_mag = torch.where(neg, ~up, up)
    mag_next = torch.where(towards_mag, mag + 1, mag - 1)
    zero = mag == 0
    # From +-0 a step down is -min_subnormal and a step up is +min_subnormal.
    mag_next = torch.where(zero, torch.ones_like(mag), mag_next)
    neg_next = torch.where(zero, ~up, neg)
    return torch.where(neg_next, mag_next | 0x8000, mag_next)


def half_bits(x: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest fp16 bit patterns of float32[...] as int32[...] in ``[0, 65536)``."""
    return x.to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF


def bits_to_half(bits: torch.Tensor) -> torch.Tensor:
    """float32 values of int32 fp16 bit patterns."""
    return bits.to(torch.int16).view(torch.float16).to(torch.float32)


def half_round_down(x: torch.Tensor) -> torch.Tensor:
    """Largest fp16 value ``<= x``, as float32 (finite inputs below 65504)."""
    bits = half_bits(x)
    over = bits_to_half(bits) > x
    return bits_to_half(torch.where(over, _half_step(bits, torch.zeros_like(over)), bits))


def half_round_up(x: torch.Tensor) -> torch.Tensor:
    """Smallest fp16 value ``>= x``, as float32."""
    bits = half_bits(x)
    under = bits_to_half(bits) < x
    return bits_to_half(torch.where(under, _half_step(bits, torch.ones_like(under)), bits))


def stochastic_round_fp16(x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Unbiased rounding to fp16 between the two neighbouring fp16 values.

    Args:
        x: float32[n, D] values.
        noise: float32[n, D] uniform in ``[0, 1)``.

    Returns:
        float16[n, D]; rounds up when ``noise < (x - lo) / (hi - lo)``.

    """
    bits = half_bits(x)
    near = bits_to_half(bits)
    above = near > x
    other = bits_to_half(_half_step(bits, ~above))
    lo = torch.where(above, other, near)
    hi = torch.where(above, near, other)
    p = (x - lo) / (hi - lo)
    out = torch.where(noise < p, hi, lo)
    return torch.where(near == x, near, out).to(torch.float16)


def stochastic_round_bf16(x: torch.Tensor, rbits: torch.Tensor) -> torch.Tensor:
    """Unbiased rounding to bf16: add 16 random bits below the kept mantissa, truncate.

    Args:
        x: float32[n, D] values.
        rbits: int64[n, D] random words; the low 16 bits are used.

    Returns:
        bfloat16[n, D].

    """
    bits = x.view(torch.int32).to(torch.int64) & MASK32
    bits = ((bits + (rbits & 0xFFFF)) & MASK32) >> 16
    bits = torch.where(bits >= 0x8000, bits - 0x10000, bits)
    return bits.to(torch.int16).view(torch.bfloat16)
