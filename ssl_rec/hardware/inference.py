"""Inference kernels: sum-pooled INT8/INT4 lookup, and the compiled kernels for serving.

:func:`quantized_bag_lookup` is the compiled twin of FBGEMM's
``embedding_bag_byte_rowwise_offsets`` / ``embedding_bag_4bit_rowwise_offsets`` (sum
pooling) on the same fused rows. :func:`serving_kernels` hands the serving model the
compiled table-batched lookup and interaction, or ``None`` where they are not in use.
"""

from __future__ import annotations

import torch

from ssl_rec.hardware.kernels.compiled import CompiledKernels
from ssl_rec.hardware.kernels.dispatch import get_kernels
from ssl_rec.hardware.kernels.table_meta import TableTensors, uncached_tables

__all__ = ["CompiledKernels", "TableTensors", "quantized_bag_lookup", "serving_kernels",
           "uncached_tables"]  # fmt: skip


def serving_kernels() -> CompiledKernels | None:
    """The compiled kernels when they are in use (``SSL_REC_KERNELS``), else ``None``.

    ``None`` (no compiler, or ``SSL_REC_KERNELS=reference``) means: serve with torch's own
    ops, which compute the same values.
    """
    kernels = get_kernels()
    return kernels if isinstance(kernels, CompiledKernels) else None


def quantized_bag_lookup(
    store: torch.Tensor, bits: int, indices: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """Sum-pooled lookup of FBGEMM fused rows.

    Args:
        store: uint8[R, row_bytes] fused rows (D + 8 bytes for 8-bit, D/2 + 4 for 4-bit).
        bits: 8 or 4.
        indices: int64[N] row ids in ``[0, R)``.
        offsets: int64[B + 1] bag boundaries, ``offsets[-1] == N``.

    Returns:
        float32[B, D].

    Example:
        >>> w = torch.ops.quantized.embedding_bag_byte_prepack(torch.randn(10, 8))
        >>> quantized_bag_lookup(w, 8, torch.tensor([1, 2]), torch.tensor([0, 2])).shape
        torch.Size([1, 8])

    """
    if bits not in (8, 4):
        raise ValueError(f"bits={bits} is not one of [8, 4]")
    if store.dtype != torch.uint8 or store.dim() != 2:
        raise ValueError(f"store must be uint8[R, row_bytes], got {store.dtype}{list(store.shape)}")
    dim = store.shape[1] - 8 if bits == 8 else (store.shape[1] - 4) * 2
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= store.shape[0]):
        raise IndexError(f"indices out of range [0, {store.shape[0]})")
    return get_kernels().bag_lookup(
        store.contiguous(), bits, indices.contiguous(), offsets.contiguous(), dim
    )
