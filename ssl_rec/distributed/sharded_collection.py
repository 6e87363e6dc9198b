"""``ShardedMixedPrecisionEmbeddingCollection``: the library's tables on TorchRec's comm layer.

A TorchRec ``ShardedModule``: ``input_dist`` sends ids with ``KJTAllToAll``, ``compute`` runs
the library's kernels on this rank's shards (:mod:`~ssl_rec.distributed.local_shards`),
``output_dist`` returns rows with TorchRec's pooled- and sequence-embedding all-to-alls and
their quantized-comm codecs. Gradients come back through the same collectives (divided by
the world size, matching data-parallel dense layers) into the shards' fused update. Inputs
and outputs are data parallel: each rank passes its local batch ``int64[B, F]`` and gets
``float32[B, F, D]``, every rank with the same B. ``prefetch_next`` pipelines the steps: the
next batch's input dist runs during the current step (:mod:`~ssl_rec.distributed.input_ahead`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torchrec.distributed.dist_data import (
    KJTAllToAll,
    PooledEmbeddingsAllToAll,
    SequenceEmbeddingsAllToAll,
)
from torchrec.distributed.types import (
    Awaitable,
    CommOp,
    LazyAwaitable,
    QuantizedCommCodecs,
    ShardedModule,
    ShardingEnv,
)
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from ssl_rec.distributed.collection_surface import CollectionSurface
from ssl_rec.distributed.cyclic_layout import split_table
from ssl_rec.distributed.input_ahead import InputAhead
from ssl_rec.distributed.local_shards import LocalShards, shard_lookup
from ssl_rec.distributed.lookup_routing import Routing, SentIds
from ssl_rec.distributed.replica_grads import ReplicaSync
from ssl_rec.distributed.table_placement import TablePlacement, check_plan
from ssl_rec.hardware.collection import MixedPrecisionEmbeddingCollection

__all__ = ["ShardedMixedPrecisionEmbeddingCollection"]


@dataclass
class ShardedLookupContext:
    """What one step's input dist learned, for compute and output dist."""

    batch: int = 0
    sent: SentIds | None = None
    received: list[int] = field(default_factory=list)
    piece_lengths: torch.Tensor | None = None
    replica_rows: torch.Tensor | None = None

    def record_stream(self, stream: torch.Stream) -> None:
        """CPU tensors need no stream bookkeeping (TorchRec's ``Multistreamable``)."""


@dataclass
class _Comms:
    """The TorchRec comm modules (not submodules: they hold no state worth saving)."""

    ids: KJTAllToAll
    whole: PooledEmbeddingsAllToAll | None
    pieces: SequenceEmbeddingsAllToAll | None


class _Assembled(LazyAwaitable[torch.Tensor]):
    def __init__(self, whole, pieces, routing: Routing, ctx: ShardedLookupContext, dim: int):
        super().__init__()
        self._whole, self._pieces, self._routing, self._ctx, self._dim = (
            whole, pieces, routing, ctx, dim)  # fmt: skip

    def _wait_impl(self) -> torch.Tensor:
        batch = self._ctx.batch
        whole = self._whole.wait() if self._whole is not None else torch.zeros(batch, 0)
        unit = self._routing.unit
        pieces = self._pieces.wait() if self._pieces is not None else torch.zeros(0, unit)
        return self._routing.assemble(whole, pieces, self._ctx.sent, batch, self._dim,
                                      self._ctx.replica_rows)  # fmt: skip


class ShardedMixedPrecisionEmbeddingCollection(
    CollectionSurface,
    ShardedModule[KeyedJaggedTensor, torch.Tensor, torch.Tensor, ShardedLookupContext],
):
    """A :class:`MixedPrecisionEmbeddingCollection` sharded over the ranks of a process group.

    Built by :class:`~ssl_rec.distributed.sharder.MixedPrecisionCollectionSharder` from the
    unsharded collection (whose tables it slices, so both start identical). A collection
    built under ``declare_tables()`` holds no rows: each rank then allocates and
    initializes only its shards, with the values the unsharded tables would have had. With FP32
    comms, training on W ranks with local batches ``B`` equals one process training the
    unsharded collection on the concatenated ``W * B`` batch, bit for bit, for every table
    precision, cache and optimizer (see :mod:`~ssl_rec.distributed.cyclic_layout`).

    The shards are plain attributes, not submodules: DDP never sees (or broadcasts) them,
    and ``state_dict()`` is the unsharded collection's, as ``ShardedTensor`` blocks (see
    :mod:`~ssl_rec.distributed.state`). ``state_dict``, ``load_state_dict``,
    ``dequantize_rows`` and ``float_weights`` are collectives: call them on every rank.

    Args:
        module: The unsharded collection (same on every rank).
        plan: Table name -> placement, covering every table.
        env: TorchRec's sharding environment (process group, world size, rank).
        qcomm_codecs_registry: TorchRec codecs by ``CommOp`` name (quantized comms).

    Shape:
        ``int64[B, F]`` -> ``float32[B, F, D]``.

    """

    def __init__(
        self,
        module: MixedPrecisionEmbeddingCollection,
        plan: Mapping[str, TablePlacement],
        env: ShardingEnv,
        qcomm_codecs_registry: dict[str, QuantizedCommCodecs] | None = None,
    ) -> None:
        super().__init__(qcomm_codecs_registry=qcomm_codecs_registry)
        self._init_surface(module)
        self._pg, world, rank = env.process_group, env.world_size, env.rank
        self.plan = check_plan(plan, self.table_names, self.cardinalities, self.specs, world)
        blocks = [spec.column_blocks for spec in self.specs]
        self.routing = Routing(self.table_names, self.plan, world, rank, self.embedding_dim,
                               blocks)  # fmt: skip
        own = module.group.tables
        init = (module.init_std, self.seed)
        # A declared (meta) table is allocated here: this rank's rows only.
        tables = [split_table(own[t], 1, 0, init) if own[t].declared else own[t]
                  for t in self.routing.whole[rank]]  # fmt: skip
        tables += [split_table(own[t], 1, 0, init) for t in self.routing.replicated]
        tables += [split_table(own[t], n, j, init) for t, j, n in self.routing.pieces[rank]]
        replicas = ReplicaSync(self._pg, rank, world) if self.routing.replicated else None
        shards = LocalShards(tables, len(self.routing.whole[rank]), self.seed,
                             self.embedding_dim, self.routing.unit,
                             len(self.routing.replicated), replicas)  # fmt: skip
        shards.step.copy_(module.group.step)
        self.__dict__["shards"] = shards  # not a submodule: see the class docstring
        self.comms = self._build_comms(world)
        self.ahead = InputAhead()

    def _build_comms(self, world: int) -> _Comms:
        codecs = self.qcomm_codecs_registry or {}
        dim, routing = self.embedding_dim, self.routing
        whole = PooledEmbeddingsAllToAll(
            self._pg, [len(w) * dim for w in routing.whole],
            codecs=codecs.get(CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL.name),
        ) if routing.has_whole else None  # fmt: skip
        pieces = SequenceEmbeddingsAllToAll(
            self._pg, [len(p) for p in routing.pieces],
            codecs=codecs.get(CommOp.SEQUENCE_EMBEDDINGS_ALL_TO_ALL.name),
        ) if routing.has_pieces else None  # fmt: skip
        return _Comms(KJTAllToAll(self._pg, routing.keys_per_rank()), whole, pieces)

    @property
    def unsharded_module_type(self) -> type[MixedPrecisionEmbeddingCollection]:
        """The module type this one shards (TorchRec's resharding looks the sharder up by it)."""
        return MixedPrecisionEmbeddingCollection

    def create_context(self) -> ShardedLookupContext:
        """A fresh per-step context."""
        return ShardedLookupContext()

    def input_dist(
        self, ctx: ShardedLookupContext, ids: torch.Tensor
    ) -> Awaitable[Awaitable[KeyedJaggedTensor]]:
        """Send each id of the local batch ``int64[B, F]`` to the rank holding its row."""
        self.check_ids(ids)
        ctx.batch = ids.shape[0]
        ctx.sent = self.routing.route(ids.to(torch.int64))
        kjt = KeyedJaggedTensor(keys=ctx.sent.keys, values=ctx.sent.values,
                                lengths=ctx.sent.lengths)  # fmt: skip
        return self.comms.ids(kjt)

    def compute(self, ctx: ShardedLookupContext, dist_input: KeyedJaggedTensor) -> torch.Tensor:
        """Look up the received ids in this rank's shards (fused update in backward)."""
        world = self.routing.world_size
        global_batch = dist_input.stride() if dist_input.keys() else ctx.batch * world
        if global_batch != ctx.batch * world:
            raise ValueError(
                f"every rank needs the same batch size; rank {self.routing.rank} has "
                f"{ctx.batch}, the ranks' total is {global_batch} over {world} ranks"
            )
        full_ids, piece_ids, ctx.received = self.routing.split_received(
            dist_input.values(), dist_input.lengths(), global_batch
        )
        ctx.piece_lengths = self.routing.piece_lengths(dist_input.lengths(), global_batch)
        train = self.training and not self.frozen
        rows = shard_lookup(self.shards, full_ids, piece_ids, train)
        if not self.routing.replicated:
            return rows
        # Replicas: this rank's samples' rows stay here; only the whole tables' rows travel.
        dim, num_whole = self.embedding_dim, len(self.routing.whole[self.routing.rank])
        per_row = self.routing.units_per_row
        whole_units = global_batch * num_whole * per_row
        replica_units = ctx.batch * len(self.routing.replicated) * per_row
        whole_rows, replica_rows, piece_rows = rows.split(
            [whole_units, replica_units, rows.shape[0] - whole_units - replica_units]
        )
        ctx.replica_rows = replica_rows.reshape(ctx.batch, len(self.routing.replicated), dim)
        return torch.cat([whole_rows, piece_rows])

    def output_dist(
        self, ctx: ShardedLookupContext, output: torch.Tensor
    ) -> LazyAwaitable[torch.Tensor]:
        """Return every row to the rank whose sample asked for it."""
        global_batch = ctx.batch * self.routing.world_size
        num_whole = len(self.routing.whole[self.routing.rank])
        whole_units = global_batch * num_whole * self.routing.units_per_row
        whole_part, piece_part = output.split([whole_units, output.shape[0] - whole_units])
        whole = pieces = None
        if self.comms.whole is not None:
            local = whole_part.reshape(global_batch, num_whole * self.embedding_dim)
            whole = self.comms.whole(local, [ctx.batch] * self.routing.world_size)
        if self.comms.pieces is not None:
            pieces = self.comms.pieces(piece_part, lengths=ctx.piece_lengths,
                                       input_splits=ctx.sent.piece_sent,
                                       output_splits=ctx.received)  # fmt: skip
        return _Assembled(whole, pieces, self.routing, ctx, self.embedding_dim)

    def prefetch_next(self, ids: torch.Tensor | None, background: bool = True) -> None:
        """Start the input dist of ``ids`` int64[B, F] during the next training forward.

        The forward after that one then uses the ids received ahead if it looks up exactly
        these ids (on every rank), else it runs its own input dist; results are the same
        either way. Call it on every rank at the same point of the step (``None`` on a rank
        without a next batch). Ids out of range are not started (their forward reports them).
        ``background`` is accepted for the unsharded signature: the all-to-all always runs
        on the process group's threads.
        """
        if ids is not None:
            ids = ids.to(torch.int64).contiguous().clone()
            try:
                self.check_ids(ids)  # a bad shape raises; bad ids are left to their forward
            except IndexError:
                ids = None
        self.ahead.schedule(ids)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Look up one id per field: ``int64[B, F]`` -> ``float32[B, F, D]`` (a collective)."""
        ctx, reused, upcoming = self.create_context(), None, None
        if self.training and torch.is_grad_enabled():
            reused, upcoming = self.ahead.settle(ids, self._pg)
        if reused is not None:
            ctx, dist_input = reused
        else:
            dist_input = self.input_dist(ctx, ids).wait().wait()
        if upcoming is not None:  # the splits' all-to-all runs beside this step's lookup
            next_ctx = self.create_context()
            splits = self.input_dist(next_ctx, upcoming)
        out = self.compute_and_output_dist(ctx, dist_input)
        if upcoming is not None:  # the ids' all-to-all runs beside the dense layers
            self.ahead.hold(upcoming, next_ctx, splits.wait())
        return out.wait()

    def local_shards(self) -> list[Any]:
        """This rank's shard tables (whole tables first)."""
        return self.shards.tables
