"""``InputAhead``: the next batch's input dist, started during the current training step.

The sharded collection's pipelined step (TorchRec's ``TrainPipelineSparseDist`` does the
same for its own modules): ``prefetch_next(ids)`` schedules the next batch's ids; the next
training forward routes them and starts their ``KJTAllToAll`` beside its own lookup, and the
ids' tensors travel on gloo's threads while the dense layers run. The forward after that
uses the ids received ahead when its ids are the ones prefetched, else it runs its own input
dist. Nothing of a table changes before its step, so results are those of the unpipelined
step, bit for bit.

Every rank issues its collectives in one order, so the decisions that start or skip one are
taken by all ranks together: one all-reduce (MIN of two flags, this rank's ids match the
pending ones / this rank has next ids) per training forward after a ``prefetch_next`` call or
with ids pending. A pending input dist is always waited for on every rank, used or not, so no
collective is ever skipped. ``prefetch_next`` must be called on every rank at the same point
of the step (the ids may differ, or be ``None`` on some ranks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["InputAhead"]


@dataclass
class _Pending:
    """A started input dist: the local ids, the step context routing filled, its awaitable."""

    ids: torch.Tensor
    ctx: Any
    received: Any  # TorchRec awaitable of the received KeyedJaggedTensor


class InputAhead:
    """The scheduled ids and the input dist in flight of one sharded collection.

    Attributes:
        used: Input dists started ahead that their forward used.
        discarded: Those a forward did not use (its ids were not the prefetched ones).

    """

    def __init__(self) -> None:
        self.scheduled: torch.Tensor | None = None
        self.asked = False
        self.pending: _Pending | None = None
        self.used = 0
        self.discarded = 0

    def schedule(self, ids: torch.Tensor | None) -> None:
        """Start ``ids`` int64[B, F] at the next training forward (``None``: start nothing)."""
        self.scheduled, self.asked = ids, True

    def settle(
        self, ids: torch.Tensor, group: dist.ProcessGroup | None
    ) -> tuple[tuple[Any, Any] | None, torch.Tensor | None]:
        """At a training forward of ``ids``: what it reuses and what it starts.

        A collective whenever something was scheduled or is pending (then on every rank).

        Returns:
            ``(context, received KeyedJaggedTensor)`` of the pending input dist when every
            rank's forward looks up the ids it prefetched (else ``None``), and the ids to
            start now when every rank scheduled some (else ``None``).

        """
        if self.pending is None and not self.asked:
            return None, None
        pending, self.pending = self.pending, None
        upcoming, self.scheduled, self.asked = self.scheduled, None, False
        match = pending is not None and pending.ids.shape == ids.shape
        match = match and torch.equal(pending.ids, ids.to(torch.int64))
        flags = torch.tensor([int(match), int(upcoming is not None)], dtype=torch.int64)
        dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=group)
        use, start = bool(flags[0]), bool(flags[1])
        reused = None
        if pending is not None:
            received = pending.received.wait()  # on every rank, used or not
            if use:
                self.used += 1
                reused = (pending.ctx, received)
            else:
                self.discarded += 1
        return reused, upcoming if start else None

    def hold(self, ids: torch.Tensor, ctx: Any, received: Any) -> None:
        """Keep a started input dist of ``ids`` for the next training forward."""
        self.pending = _Pending(ids, ctx, received)
