"""Replicated tables: this rank's samples forward, one all-reduce of per-unique-row gradients back.

Every rank admits a replicated (``data_parallel``) table's ids of the whole global batch (they
came by the input all-to-all), so every replica's cache admits the same rows and the batch's
plan (unique rows, inverse, slots) is the same on every rank; the rank gathers only its own
samples' rows. In backward each rank sums its samples' gradients per unique row of that plan
(``[U, D]``, ``U`` at most the table's rows and the global batch), one all-reduce sums those
over the ranks, divided by the world size as the other tables' all-to-alls and DDP's
averaging of the dense layers are, and every replica applies the fused update to the ``U``
rows from these sums. The all-reduce gives every rank the same bytes, so the replicas stay
bit-identical; against one process, which also sums per unique row, only the order of each
row's sum differs. No rank looks up or sends the other ranks' samples' rows or gradients.
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


def row_grads(plan: AdmittedBatch, grad: torch.Tensor, start: int) -> torch.Tensor:
    """This rank's gradient summed per unique row of the global plan, in sample order.

    Args:
        plan: The global batch's plan (``[T, B_global]``, ``U_t`` unique rows per table).
        grad: float32[B, T, D] gradient of this rank's samples ``start : start + B``.
        start: First sample of this rank.

    Returns:
        float32[sum_t U_t, D]: table 0's ``U_0`` rows, then table 1's, ... (zero for a row
        none of this rank's samples looked up).

    """
    batch, tables, dim = grad.shape
    counts = plan.num_unique
    offsets = torch.cumsum(counts, 0) - counts
    index = plan.inverse[:, start : start + batch].to(torch.int64) + offsets[:, None]
    out = torch.zeros(int(counts.sum()), dim)
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
    """How a rank's replicas see the other ranks: its samples, and the gradients' all-reduce.

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
        """Every rank's gradients of each plan, per unique row, divided by W (a collective).

        Args:
            plans: The global plans of this rank's replica kernel calls (same on every rank).
            grads: float32[B_c, T_c, D_c] gradient of this rank's samples of each.

        Returns:
            Per call, the ``(plan', grad)`` of :func:`unique_row_update` for the summed
            gradients: one all-reduce of ``sum_c sum_t U_t * D_c`` floats for all calls.

        """
        parts = [row_grads(p, g, self.rank * g.shape[0]).reshape(-1)
                 for p, g in zip(plans, grads, strict=True)]  # fmt: skip
        flat = torch.cat(parts) if len(parts) > 1 else parts[0]
        if self.world > 1:
            dist.all_reduce(flat, group=self.group)
        flat.div_(self.world)
        sizes = [p.numel() for p in parts]
        return [unique_row_update(p, s.view(-1, g.shape[2]))
                for p, g, s in zip(plans, grads, flat.split(sizes), strict=True)]  # fmt: skip
