"""Replicated tables' rows: keep this rank's samples forward, gather every rank's gradient back.

Every rank looks a replicated (``data_parallel``) table up for the whole global batch (the
ids came by the input all-to-all), keeps its own samples' rows, and in backward receives the
gradients of every rank's samples, so that each replica applies the same fused update to the
same global batch: the replicas stay bit-identical, and equal one process training the table
on the concatenated batch. Gradients are divided by the world size, as the other tables'
all-to-alls and DDP's averaging of the dense layers do.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["keep_local_samples"]


class _KeepLocalSamples(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, group, rank, world):  # noqa: D102
        ctx.group, ctx.world = group, world
        batch = rows.shape[0] // world
        return rows[rank * batch : (rank + 1) * batch]

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        grad = grad.contiguous()
        parts = [torch.empty_like(grad) for _ in range(ctx.world)]
        dist.all_gather(parts, grad, group=ctx.group)
        return torch.cat(parts).div_(ctx.world), None, None, None


def keep_local_samples(
    rows: torch.Tensor, group: dist.ProcessGroup | None, rank: int, world: int
) -> torch.Tensor:
    """This rank's samples of the global batch's rows; in backward, every rank's gradients.

    Args:
        rows: float32[W * B, ...] rows of the global batch, ranks' samples in rank order.
        group: The process group of the collection.
        rank: This rank in ``group``.
        world: W.

    Returns:
        float32[B, ...] rows ``rank * B : (rank + 1) * B``. Its gradient ``[B, ...]`` flows
        back as ``float32[W * B, ...]``: every rank's gradient, divided by W (a collective in
        backward: every rank's backward must reach it).

    """
    if not (rows.requires_grad and torch.is_grad_enabled()):
        batch = rows.shape[0] // world
        return rows[rank * batch : (rank + 1) * batch]
    return _KeepLocalSamples.apply(rows, group, rank, world)
