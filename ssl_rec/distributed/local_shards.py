"""``LocalShards``: one rank's shards of a collection's tables, run by the library's kernels.

The shard-local lookup and fused update of a sharded collection. Table-wise shards see every
sample of the global batch, so they are looked up together by one kernel call (ids
``[B, T]``, one call per block width with column blocks); replicas admit the global batch
too, in a call of their own, but gather and return only this rank's samples, and update
from per-unique-row gradients summed along the ranks in sample order
(:mod:`~ssl_rec.distributed.replica_grads`); row-wise and column-wise shards see a
different number of ids each and get one call per shard.
Tables are independent in the kernels, so this grouping never changes a result. One step
counter serves every shard and advances exactly as the unsharded collection's does (one step
per training forward and one per backward), so the stochastic-rounding RNG draws the same
numbers.
"""

from __future__ import annotations

import torch
from torch import nn

from ssl_rec.distributed.replica_grads import ReplicaSync
from ssl_rec.hardware.column_blocks import block_calls, expand_ids, merge_blocks, split_blocks
from ssl_rec.hardware.kernels.dispatch import get_kernels
from ssl_rec.hardware.kernels.table_meta import AdmittedBatch
from ssl_rec.hardware.table import EmbeddingTable
from ssl_rec.hardware.table_group import TableGroup

__all__ = ["LocalShards", "shard_lookup"]


class LocalShards(nn.Module):
    """The shards one rank owns: whole tables, then replicas, then row- and column-wise pieces.

    Args:
        tables: This rank's shards: ``num_whole`` whole tables, ``num_replicated`` replicas,
            then the pieces.
        num_whole: Shards looked up for every sample of the global batch (table-wise).
        seed: Seed of the stochastic-rounding RNG (the unsharded collection's).
        dim: Embedding dimension D.
        unit: Values per row of the flat output (default D; it divides D and every column
            piece's ``D / n``, see :class:`~ssl_rec.distributed.lookup_routing.Routing`).
        num_replicated: Replicas (``data_parallel`` tables), after the whole tables.
        replicas: This rank's place among the replicas (needed with ``num_replicated``).

    Attributes:
        step: int64 scalar buffer, the RNG step counter (the unsharded collection's value).

    Shape:
        Lookups take the whole tables' and replicas' ids of the global batch
        ``int64[B_global, num_whole + num_replicated]`` and return
        ``float32[(B_global * num_whole * D + B * num_replicated * D + sum(n_k * D_k)) /
        unit, unit]``: the whole tables' rows sample-major (``[B_global, num_whole, D]``
        flattened), the replicas' rows of this rank's ``B = B_global / W`` samples
        (``[B, num_replicated, D]``), then each piece's ``n_k`` ids' values (``D_k = D`` for
        a row-wise piece, the ``D / n`` of its column blocks for a column-wise one).

    """

    def __init__(
        self,
        tables: list[EmbeddingTable],
        num_whole: int,
        seed: int,
        dim: int,
        unit: int | None = None,
        num_replicated: int = 0,
        replicas: ReplicaSync | None = None,
    ) -> None:
        super().__init__()
        if num_replicated and replicas is None:
            raise ValueError("LocalShards with replicated tables needs their ReplicaSync")
        self.group = TableGroup(tables, seed) if tables else None
        self.num_whole, self.dim, self.seed = num_whole, dim, seed
        self.num_replicated, self.replicas = num_replicated, replicas
        self.unit = dim if unit is None else unit
        per_id = [t.rows_per_id for t in tables]
        self._whole_calls = block_calls(per_id[:num_whole]) if num_whole else []
        full = num_whole + num_replicated
        self._replica_calls = [([num_whole + i for i in idx], per)
                               for idx, per in block_calls(per_id[num_whole:full])]  # fmt: skip
        self._piece_per = per_id[full:]
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))

    @property
    def tables(self) -> list[EmbeddingTable]:
        """The shard tables (whole tables first)."""
        return list(self.group.tables) if self.group is not None else []

    def _next_step(self) -> int:
        step = int(self.step)
        self.step += 1
        return step

    def _calls(self, full_ids: torch.Tensor, piece_ids: list[torch.Tensor]):
        """(table indices, int64[n * per, T] rows, per) of each kernel call, in output order.

        Whole tables' calls first, then the replicas' (ids of the global batch), then one
        per piece.
        """
        calls = []
        only = len(self._whole_calls) == 1 and not self.num_replicated
        for tables, per in self._whole_calls:
            ids = full_ids if only else full_ids[:, tables].contiguous()
            calls.append((tables, expand_ids(ids, per), per))
        for tables, per in self._replica_calls:
            calls.append((tables, expand_ids(full_ids[:, tables].contiguous(), per), per))
        full = self.num_whole + self.num_replicated
        for k, (ids, per) in enumerate(zip(piece_ids, self._piece_per, strict=True)):
            calls.append(([full + k], expand_ids(ids.reshape(-1, 1), per), per))
        return calls

    def _local_batch(self, global_batch: int) -> int:
        return global_batch // self.replicas.world if self.replicas is not None else global_batch

    def _join(self, outs: list[torch.Tensor], batch: int) -> torch.Tensor:
        """The flat output (see the class's Shape) of each call's float32[n * per, T, d].

        ``batch`` is B_global; the replicas' calls return this rank's samples only.
        """
        nw, nr = len(self._whole_calls), len(self._replica_calls)
        whole, replicas, pieces = outs[:nw], outs[nw : nw + nr], outs[nw + nr :]
        parts = []
        if len(whole) == 1:
            parts.append(merge_blocks(whole[0], self._whole_calls[0][1]))
        elif whole:
            rows = torch.empty(batch, self.num_whole, self.dim)
            for (tables, per), out in zip(self._whole_calls, whole, strict=True):
                rows[:, tables] = merge_blocks(out, per)
            parts.append(rows)
        if replicas:
            rows = torch.empty(self._local_batch(batch), self.num_replicated, self.dim)
            for (tables, per), out in zip(self._replica_calls, replicas, strict=True):
                rows[:, [t - self.num_whole for t in tables]] = merge_blocks(out, per)
            parts.append(rows)
        parts += [merge_blocks(o, p) for o, p in zip(pieces, self._piece_per, strict=True)]
        if not parts:
            return torch.zeros(0, self.unit)
        return torch.cat([p.reshape(-1, self.unit) for p in parts])

    def _split_grad(self, grad: torch.Tensor, full_ids: torch.Tensor,
                    piece_ids: list[torch.Tensor]) -> list[torch.Tensor]:  # fmt: skip
        """Each call's float32[n * per, T, d] gradient of the flat output's ``grad``."""
        batch = full_ids.shape[0]
        local = self._local_batch(batch)
        full = self.num_whole + self.num_replicated
        sizes = [batch * self.num_whole * self.dim, local * self.num_replicated * self.dim]
        sizes += [
            ids.numel() * self.tables[full + k].dim * per
            for k, (ids, per) in enumerate(zip(piece_ids, self._piece_per, strict=True))
        ]
        flat = grad.float().reshape(-1).split(sizes)
        parts = []
        if self._whole_calls:
            rows = flat[0].view(batch, self.num_whole, self.dim)
            single = len(self._whole_calls) == 1
            for tables, per in self._whole_calls:
                parts.append(split_blocks(rows if single else rows[:, tables], per))
        if self._replica_calls:
            rows = flat[1].view(local, self.num_replicated, self.dim)
            for tables, per in self._replica_calls:
                parts.append(split_blocks(rows[:, [t - self.num_whole for t in tables]], per))
        for k, (ids, per) in enumerate(zip(piece_ids, self._piece_per, strict=True)):
            parts.append(split_blocks(flat[2 + k].view(ids.numel(), 1, -1), per))
        return parts

    @torch.no_grad()
    def lookup(self, full_ids: torch.Tensor, piece_ids: list[torch.Tensor]) -> torch.Tensor:
        """Current values (cache if cached, else store), no side effects.

        Args:
            full_ids: int64[B_global, num_whole + num_replicated] local ids of the whole
                tables and replicas (a replica looks up this rank's samples only).
            piece_ids: One int64[n_k] of local ids per piece (logical ids for column-wise).

        """
        kernels = get_kernels()
        batch = full_ids.shape[0]
        nw, nr = len(self._whole_calls), len(self._replica_calls)
        outs = []
        for c, (idx, ids, per) in enumerate(self._calls(full_ids, piece_ids)):
            if nw <= c < nw + nr:  # a replica: this rank's samples
                rows = self._local_batch(batch) * per
                ids = ids[self.replicas.rank * rows : (self.replicas.rank + 1) * rows]
            outs.append(kernels.forward(self.group.tensors(idx), ids))
        return self._join(outs, batch)

    @torch.no_grad()
    def admit_and_lookup(
        self, full_ids: torch.Tensor, piece_ids: list[torch.Tensor]
    ) -> tuple[torch.Tensor, list[AdmittedBatch]]:
        """Admit the ids into the caches and look them up (one training forward step).

        Every call admits all its ids (a replica's: the global batch's); a replica's gather
        reads this rank's samples only.

        Returns:
            The values (see the class's Shape) and each kernel call's admission plan.

        """
        step, kernels = self._next_step(), get_kernels()
        batch = full_ids.shape[0]
        nw, nr = len(self._whole_calls), len(self._replica_calls)
        outs, plans = [], []
        for c, (idx, ids, per) in enumerate(self._calls(full_ids, piece_ids)):
            tensors = self.group.tensors(idx)
            plan = kernels.admit(tensors, ids, self.seed, step)
            if nw <= c < nw + nr:
                rows = self._local_batch(batch) * per
                outs.append(kernels.gather(tensors, self.replicas.local_plan(plan, rows))[:rows])
            else:
                outs.append(kernels.gather(tensors, plan))
            plans.append(plan)
        return self._join(outs, batch), plans

    @torch.no_grad()
    def apply_update(
        self,
        full_ids: torch.Tensor,
        piece_ids: list[torch.Tensor],
        grad: torch.Tensor,
        plans: list[AdmittedBatch],
    ) -> None:
        """Fused optimizer step for ``grad`` (laid out as the lookup's output).

        The replicas' part is this rank's samples' gradient; it is summed per unique row and
        all-reduced over the ranks first (a collective: every rank's backward reaches it).
        """
        step, kernels = self._next_step(), get_kernels()
        grads = [part.contiguous() for part in self._split_grad(grad, full_ids, piece_ids)]
        nw, nr = len(self._whole_calls), len(self._replica_calls)
        if nr:
            reduced = self.replicas.reduce(plans[nw : nw + nr], grads[nw : nw + nr])
            plans = [*plans[:nw], *(p for p, _ in reduced), *plans[nw + nr :]]
            grads = [*grads[:nw], *(g for _, g in reduced), *grads[nw + nr :]]
        calls = self._calls(full_ids, piece_ids)
        for (idx, _, _), plan, part in zip(calls, plans, grads, strict=True):
            kernels.update(self.group.tensors(idx), plan, part, self.seed, step)


class _ShardLookup(torch.autograd.Function):
    """Training lookup whose backward runs the shards' fused update (no dense gradient)."""

    @staticmethod
    def forward(ctx, placeholder, shards, full_ids, piece_ids, update):  # noqa: D102
        out, slots = shards.admit_and_lookup(full_ids, piece_ids)
        ctx.shards, ctx.update, ctx.ids, ctx.slots = shards, update, (full_ids, piece_ids), slots
        return out

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        if ctx.update:
            ctx.shards.apply_update(*ctx.ids, grad, ctx.slots)
        return None, None, None, None, None


def shard_lookup(
    shards: LocalShards, full_ids: torch.Tensor, piece_ids: list[torch.Tensor], train: bool
) -> torch.Tensor:
    """Look up this rank's shards; in training the output's backward updates them.

    Args:
        shards: This rank's shards.
        full_ids: int64[B_global, num_whole + num_replicated] ids of the whole tables and
            replicas.
        piece_ids: One int64[n_k] per row-wise shard.
        train: Admit into the caches and attach the fused update (needs grad mode).

    Returns:
        The flat rows of :class:`LocalShards` (``[B_global * num_whole + B * num_replicated
        + sum(n_k), D]`` without column-wise pieces); requires grad when training, on every
        rank (even one without shards), so every rank joins the collectives of backward.

    """
    if shards.group is None and not train:
        return torch.zeros(0, shards.unit)
    if not (train and torch.is_grad_enabled()):
        return shards.lookup(full_ids, piece_ids)
    placeholder = torch.empty(0, requires_grad=True)
    if shards.group is None:
        return placeholder.new_zeros(0, shards.unit) + placeholder.sum()
    return _ShardLookup.apply(placeholder, shards, full_ids, piece_ids, True)
