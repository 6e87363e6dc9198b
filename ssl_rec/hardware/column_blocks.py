"""Column blocks: a logical ``[R, D]`` table kept as ``[R * k, D / k]`` rows for the kernels.

A table with ``TableSpec.column_blocks = k`` stores block ``b`` of logical row ``r`` as row
``r * k + b`` of a table ``D / k`` wide, so each block is quantized, cached and optimized on
its own by the unchanged kernels. A lookup of logical ids asks for ``per`` consecutive rows
per id (``k`` for a whole table; ``k / n`` for one of ``n`` column-wise shards, which holds
the blocks ``b = j (mod n)`` as its consecutive local rows ``r * k / n + i``) and puts the
``per`` blocks side by side; the gradient goes back the same way. The kernels take one width
per call, so a group runs one call per ``per`` (:func:`block_calls`); tables are independent
in the kernels, so how they are grouped into calls never changes a result.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["block_calls", "expand_ids", "merge_blocks", "split_blocks"]


def block_calls(per_id: Sequence[int]) -> list[tuple[list[int], int]]:
    """Tables grouped by rows per id: ``[(table indices, per), ...]``, ``per == 1`` first.

    Args:
        per_id: Rows each table's lookup reads per id (1 for an unblocked table).

    """
    calls: dict[int, list[int]] = {}
    for index, per in enumerate(per_id):
        calls.setdefault(int(per), []).append(index)
    return [(calls[per], per) for per in sorted(calls)]


def expand_ids(ids: torch.Tensor, per: int) -> torch.Tensor:
    """int64[B, T] ids -> int64[B * per, T] rows ``id * per + i`` (row ``b * per + i``)."""
    if per == 1:
        return ids
    steps = torch.arange(per, dtype=torch.int64)[None, :, None]
    return (ids[:, None, :] * per + steps).reshape(-1, ids.shape[1])


def merge_blocks(rows: torch.Tensor, per: int) -> torch.Tensor:
    """float32[B * per, T, d] looked-up blocks -> float32[B, T, per * d] rows."""
    if per == 1:
        return rows
    n, tables, width = rows.shape
    return rows.view(n // per, per, tables, width).transpose(1, 2).reshape(-1, tables, per * width)


def split_blocks(grad: torch.Tensor, per: int) -> torch.Tensor:
    """float32[B, T, per * d] -> contiguous float32[B * per, T, d] (inverse of merge_blocks)."""
    if per == 1:
        return grad.contiguous()
    batch, tables, width = grad.shape
    blocks = grad.reshape(batch, tables, per, width // per).transpose(1, 2)
    return blocks.reshape(batch * per, tables, width // per)
