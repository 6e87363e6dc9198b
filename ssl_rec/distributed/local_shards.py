"""``LocalShards``: one rank's shards of a collection's tables, run by the library's kernels.

The shard-local lookup and fused update of a sharded collection. Table-wise shards see every
sample of the global batch, so they are looked up together by one kernel call (ids
``[B, T]``); row-wise shards see a different number of ids each and get one call per shard.
Tables are independent in the kernels, so this grouping never changes a result. One step
counter serves every shard and advances exactly as the unsharded collection's does (one step
per training forward and one per backward), so the stochastic-rounding RNG draws the same
numbers.
"""

from __future__ import annotations

import torch
from torch import nn

from ssl_rec.hardware.kernels.dispatch import get_kernels
from ssl_rec.hardware.kernels.table_meta import AdmittedBatch
from ssl_rec.hardware.table import EmbeddingTable
from ssl_rec.hardware.table_group import TableGroup

__all__ = ["LocalShards", "shard_lookup"]


class LocalShards(nn.Module):
    """The shards one rank owns: whole tables first, then row-wise pieces.

    Args:
        tables: This rank's shards, the ``num_whole`` whole tables first.
        num_whole: Shards looked up for every sample of the global batch (table-wise).
        seed: Seed of the stochastic-rounding RNG (the unsharded collection's).
        dim: Embedding dimension D.

    Attributes:
        step: int64 scalar buffer, the RNG step counter (the unsharded collection's value).

    Shape:
        Lookups return ``float32[B * num_whole + sum(n_k), D]``: the whole tables' rows
        sample-major (``[B, num_whole, D]`` flattened), then each row-wise shard's ``n_k``.

    """

    def __init__(self, tables: list[EmbeddingTable], num_whole: int, seed: int, dim: int) -> None:
        super().__init__()
        self.group = TableGroup(tables, seed) if tables else None
        self.num_whole, self.dim, self.seed = num_whole, dim, seed
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))

    @property
    def tables(self) -> list[EmbeddingTable]:
        """The shard tables (whole tables first)."""
        return list(self.group.tables) if self.group is not None else []

    def _next_step(self) -> int:
        step = int(self.step)
        self.step += 1
        return step

    def _calls(self, whole_ids: torch.Tensor, piece_ids: list[torch.Tensor]):
        """(table indices, int64[n, T] ids) of each kernel call, in output order."""
        calls = []
        if self.num_whole:
            calls.append((list(range(self.num_whole)), whole_ids))
        for k, ids in enumerate(piece_ids):
            calls.append(([self.num_whole + k], ids.reshape(-1, 1)))
        return calls

    def _join(self, outs: list[torch.Tensor]) -> torch.Tensor:
        if not outs:
            return torch.zeros(0, self.dim)
        return torch.cat([o.reshape(-1, self.dim) for o in outs])

    @torch.no_grad()
    def lookup(self, whole_ids: torch.Tensor, piece_ids: list[torch.Tensor]) -> torch.Tensor:
        """Current values (cache if cached, else store), no side effects.

        Args:
            whole_ids: int64[B, num_whole] local ids of the whole tables.
            piece_ids: One int64[n_k] of local ids per row-wise shard.

        """
        kernels = get_kernels()
        outs = [kernels.forward(self.group.tensors(idx), ids) for idx, ids in
                self._calls(whole_ids, piece_ids)]  # fmt: skip
        return self._join(outs)

    @torch.no_grad()
    def admit_and_lookup(
        self, whole_ids: torch.Tensor, piece_ids: list[torch.Tensor]
    ) -> tuple[torch.Tensor, list[AdmittedBatch]]:
        """Admit the ids into the caches and look them up (one training forward step).

        Returns:
            The values (see the class's Shape) and each kernel call's admission plan.

        """
        step, kernels = self._next_step(), get_kernels()
        outs, plans = [], []
        for idx, ids in self._calls(whole_ids, piece_ids):
            tensors = self.group.tensors(idx)
            plan = kernels.admit(tensors, ids, self.seed, step)
            outs.append(kernels.gather(tensors, plan))
            plans.append(plan)
        return self._join(outs), plans

    @torch.no_grad()
    def apply_update(
        self,
        whole_ids: torch.Tensor,
        piece_ids: list[torch.Tensor],
        grad: torch.Tensor,
        plans: list[AdmittedBatch],
    ) -> None:
        """Fused optimizer step for ``grad`` (laid out as the lookup's output)."""
        step, kernels, start = self._next_step(), get_kernels(), 0
        for (idx, ids), plan in zip(self._calls(whole_ids, piece_ids), plans, strict=True):
            n = ids.numel()
            part = grad[start : start + n].reshape(ids.shape[0], ids.shape[1], self.dim)
            kernels.update(self.group.tensors(idx), plan, part.float().contiguous(), self.seed,
                           step)  # fmt: skip
            start += n


class _ShardLookup(torch.autograd.Function):
    """Training lookup whose backward runs the shards' fused update (no dense gradient)."""

    @staticmethod
    def forward(ctx, placeholder, shards, whole_ids, piece_ids, update):  # noqa: D102
        out, slots = shards.admit_and_lookup(whole_ids, piece_ids)
        ctx.shards, ctx.update, ctx.ids, ctx.slots = shards, update, (whole_ids, piece_ids), slots
        return out

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        if ctx.update:
            ctx.shards.apply_update(*ctx.ids, grad, ctx.slots)
        return None, None, None, None, None


def shard_lookup(
    shards: LocalShards, whole_ids: torch.Tensor, piece_ids: list[torch.Tensor], train: bool
) -> torch.Tensor:
    """Look up this rank's shards; in training the output's backward updates them.

    Args:
        shards: This rank's shards.
        whole_ids: int64[B, num_whole] ids of the whole tables.
        piece_ids: One int64[n_k] per row-wise shard.
        train: Admit into the caches and attach the fused update (needs grad mode).

    Returns:
        float32[B * num_whole + sum(n_k), D]; requires grad when training, on every rank
        (even one without shards), so every rank joins the collectives of backward.

    """
    if shards.group is None and not train:
        return torch.zeros(0, shards.dim)
    if not (train and torch.is_grad_enabled()):
        return shards.lookup(whole_ids, piece_ids)
    placeholder = torch.empty(0, requires_grad=True)
    if shards.group is None:
        return placeholder.new_zeros(0, shards.dim) + placeholder.sum()
    return _ShardLookup.apply(placeholder, shards, whole_ids, piece_ids, True)
