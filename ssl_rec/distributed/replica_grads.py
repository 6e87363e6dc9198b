"""Replicated tables: this rank's samples forward, one ordered chain of per-row sums back.

Every rank admits a replicated (``data_parallel``) table's ids of the whole global batch (they
came by the input all-to-all), so every replica's cache admits the same rows and the batch's
plan (unique rows, inverse, slots) is the same on every rank; the rank gathers only its own
samples' rows. In backward the gradient of each unique row of that plan (``[U, D]``, ``U`` at
most the table's rows and the global batch) is summed in global sample order, as the kernels
sum it in one process: rank 0 adds its samples' gradients in sample order, sends the partial
sums to rank 1, which goes on adding its samples, ..., and the last rank broadcasts the sums;
every rank divides them by the world size (as the other tables' all-to-alls and DDP's
averaging of the dense layers do) and applies the fused update to the ``U`` rows. The kernels
start each row's sum from its first sample's gradient and add the next ones in sample order,
so the chain gives the bits one process sums for the concatenated batch, and every rank gets
the same bytes: replicas equal each other and one process. No rank looks up or sends the
other ranks' samples' rows or per-sample gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ssl_rec.hardware.kernels.table_meta import AdmittedBatch

__all__ = ["ReplicaSync", "local_plan", "row_grads", "unique_row_update"]


def local_plan(plan: AdmittedBatch, start: int, batch: int) -> AdmittedBatch:
    """The plan of samples ``start : start + batch`` of an admitted batch, for ``gather``.

    Args:
        plan: The global batch's plan (``[T, B_global]``).
        start: First sample of this rank.
        batch: Its samples (B).

    Returns:
        A plan of ``max(B, U_max)`` samples whose first B are these samples (the kernels take
        as many samples as unique rows): gather it and keep the first B rows.

    """
    width = max(batch, int(plan.num_unique.max()) if plan.num_unique.numel() else 0)
    inverse = torch.zeros(plan.inverse.shape[0], width, dtype=torch.int32)
    inverse[:, :batch] = plan.inverse[:, start : start + batch]
    return AdmittedBatch(plan.rows[:, :width].contiguous(), plan.num_unique, inverse,
                         plan.slots[:, :width].contiguous())  # fmt: skip


def row_grads(
    plan: AdmittedBatch, grad: torch.Tensor, start: int, partial: torch.Tensor | None = None
) -> torch.Tensor:
    """Samples ``start : start + B``'s gradients added per unique row, in sample order.

    Each row's sum is ``((p + g_1) + g_2) + ...`` over its samples in order, ``p`` the row of
    ``partial``; without ``partial`` it starts from ``-0.0``, the value whose sum with any
    float is that float, so a row's sum starts from its first sample's gradient as is, as the
    kernels' does. Feeding one rank's result to the next rank's call therefore gives the
    kernels' per-row sums of the concatenated samples, bit for bit.

    Args:
        plan: The global batch's plan (``[T, B_global]``, ``U_t`` unique rows per table).
        grad: float32[B, T, D] gradient of the samples ``start : start + B``.
        start: Their first sample in the global batch.
        partial: float32[sum_t U_t, D] sums of the samples before ``start``, added to in
            place, or None.

    Returns:
        float32[sum_t U_t, D]: table 0's ``U_0`` rows, then table 1's, ... (``partial``'s
        value, or ``-0.0``, for a row none of these samples looked up).

    """
    batch, tables, dim = grad.shape
    counts = plan.num_unique
    offsets = torch.cumsum(counts, 0) - counts
    index = plan.inverse[:, start : start + batch].to(torch.int64) + offsets[:, None]
    out = torch.full((int(counts.sum()), dim), -0.0) if partial is None else partial
    # index_add_ on contiguous rows adds the source rows one after another in index order
    # (sample-major here), so each row's additions follow the sample order.
    return out.index_add_(0, index.t().reshape(-1), grad.reshape(batch * tables, dim))


def unique_row_update(
    plan: AdmittedBatch, sums: torch.Tensor
) -> tuple[AdmittedBatch, torch.Tensor]:
    """A plan and gradient whose fused update applies ``sums`` to the plan's unique rows.

    Args:
        plan: The global batch's plan.
        sums: float32[sum_t U_t, D] per-unique-row gradients (the layout of :func:`row_grads`).

    Returns:
        ``(plan', grad)``: ``plan'`` has one sample per unique row (``U_max`` samples, the
        same rows and slots), ``grad`` float32[U_max, T, D] holds ``sums``; a table's samples
        past its ``U_t`` point at its row 0 with gradient ``-0.0``, which leaves that row's
        sum unchanged in every bit. The kernels' update of ``(plan', grad)`` is the update of
        ``plan`` by a gradient whose per-row sums are ``sums``.

    """
    counts = plan.num_unique
    tables, width = counts.numel(), int(counts.max()) if counts.numel() else 0
    dim = sums.shape[1]
    steps = torch.arange(width, dtype=torch.int64)
    live = steps[None, :] < counts[:, None]  # [T, U_max]
    inverse = torch.where(live, steps[None, :], 0).to(torch.int32)
    grad = torch.full((width, tables, dim), -0.0)
    grad.transpose(0, 1)[live] = sums
    return AdmittedBatch(plan.rows[:, :width].contiguous(), counts, inverse,
                         plan.slots[:, :width].contiguous()), grad  # fmt: skip


@dataclass(frozen=True)
class ReplicaSync:
    """How a rank's replicas see the other ranks: its samples, and the chain of row sums.

    Attributes:
        group: The collection's process group.
        rank: This rank in ``group``.
        world: W, the ranks in ``group``.

    """

    group: dist.ProcessGroup | None
    rank: int
    world: int

    def local_plan(self, plan: AdmittedBatch, rows_per_rank: int) -> AdmittedBatch:
        """See :func:`local_plan`: this rank's ``rows_per_rank`` samples of ``plan``."""
        return local_plan(plan, self.rank * rows_per_rank, rows_per_rank)

    def reduce(
        self, plans: list[AdmittedBatch], grads: list[torch.Tensor]
    ) -> list[tuple[AdmittedBatch, torch.Tensor]]:
        """Every rank's gradients of each plan, per unique row, divided by W (collectives).

        The per-row sums are accumulated along the ranks in order (receive rank ``r - 1``'s
        sums, add this rank's samples, send them to rank ``r + 1``) and the last rank
        broadcasts them: one message of ``sum_c sum_t U_t * D_c`` floats per hop for all
        calls, ``W - 1`` hops and one broadcast per step, the same on every rank.

        Args:
            plans: The global plans of this rank's replica kernel calls (same on every rank).
            grads: float32[B_c, T_c, D_c] gradient of this rank's samples of each.

        Returns:
            Per call, the ``(plan', grad)`` of :func:`unique_row_update` for the summed
            gradients.

        """
        sizes = [int(p.num_unique.sum()) * g.shape[2] for p, g in zip(plans, grads, strict=True)]
        flat = torch.full((sum(sizes),), -0.0)
        if self.rank > 0:
            dist.recv(flat, group=self.group, group_src=self.rank - 1)
        for p, g, s in zip(plans, grads, flat.split(sizes), strict=True):
            row_grads(p, g, self.rank * g.shape[0], s.view(-1, g.shape[2]))
        if self.rank < self.world - 1:
            dist.send(flat, group=self.group, group_dst=self.rank + 1)
        if self.world > 1:
            dist.broadcast(flat, group=self.group, group_src=self.world - 1)
        flat.div_(self.world)
        return [unique_row_update(p, s.view(-1, g.shape[2]))
                for p, g, s in zip(plans, grads, flat.split(sizes), strict=True)]  # fmt: skip
