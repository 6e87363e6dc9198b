"""The state of a sharded collection under the unsharded collection's keys and shapes.

``state_dict()`` of a sharded collection holds, for every logical tensor of a table
(``group.tables.{t}.store``, ``.momentum``, ``.cache.rows``, ``.cache.tags``, ``.cache.state``),
a ``ShardedTensor`` of the unsharded shape cut in even row blocks, which
torch.distributed.checkpoint saves once and reshards on load (to any world size, or to one
process without a process group). ``cache.stats`` are summed over ranks and ``group.step``
is replicated, as plain tensors. Loading accepts those ``ShardedTensor`` blocks or plain
full tensors (an unsharded collection's ``state_dict``): every rank keeps its cyclic rows.
A replicated (``data_parallel``) table is saved from its first rank's replica, as a table
held whole there, and loaded into every replica.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor

from ssl_rec.distributed.cyclic_layout import table_pieces
from ssl_rec.distributed.redistribute import block_range, blocks_to_cyclic, cyclic_to_blocks
from ssl_rec.distributed.table_placement import TablePlacement
from ssl_rec.hardware.cache import cache_geometry
from ssl_rec.hardware.kernels.table_meta import CACHE_WAYS
from ssl_rec.hardware.spec import TableSpec
from ssl_rec.hardware.table import EmbeddingTable

__all__ = ["TableState", "load_table_state", "save_table_state"]

SPLIT_KEYS: tuple[str, ...] = ("store", "momentum", "cache.rows", "cache.tags", "cache.state")


class TableState:
    """Shapes of one logical table and this rank's shard of it.

    Args:
        num_rows: Rows R of the logical table.
        dim: D.
        spec: The table's spec.
        placement: Its ranks.
        shard: This rank's shard table, or ``None`` when it holds none.

    """

    def __init__(
        self,
        num_rows: int,
        dim: int,
        spec: TableSpec,
        placement: TablePlacement,
        shard: EmbeddingTable | None,
    ) -> None:
        self.num_rows, self.dim, self.spec = num_rows, dim, spec
        self.ranks, self.shard = placement.ranks, shard
        self.replicated = placement.replicated
        self.sets = cache_geometry(num_rows, spec)

    def holders(self) -> tuple[int, ...]:
        """The ranks whose rows make up the saved table (a replica's first rank only)."""
        return self.ranks[:1] if self.replicated else self.ranks

    def saved_shard(self, rank: int) -> EmbeddingTable | None:
        """This rank's part of the saved table (``None`` for a replica but the first)."""
        return self.shard if rank in self.holders() else None

    def logical_shape(self, key: str) -> tuple[int, ...]:
        """Shape of ``key`` in the unsharded collection (``cache.rows`` as ``[S, W * D]``)."""
        store_cols = self.spec.precision.store_shape(self.num_rows, self.dim)[1]
        momentum = self.num_rows if self.spec.optimizer == "rowwise_adagrad" else 0
        state_cols = 1 if self.spec.cache_policy == "lru" else CACHE_WAYS
        return {
            "store": (self.num_rows, store_cols),
            "momentum": (momentum,),
            "cache.rows": (self.sets, CACHE_WAYS * self.dim),
            "cache.tags": (self.sets, CACHE_WAYS),
            "cache.state": (self.sets, state_cols),
        }[key]

    def dtype(self, key: str) -> torch.dtype:
        """The dtype of ``key``."""
        return {"store": self.spec.precision.dtype, "cache.tags": torch.int16,
                "cache.state": torch.uint8}.get(key, torch.float32)  # fmt: skip

    def _rows(self, key: str, shard: EmbeddingTable | None) -> torch.Tensor:
        if shard is not None:
            return table_pieces(shard)[key]
        return torch.empty((0, *self.logical_shape(key)[1:]), dtype=self.dtype(key))

    def piece(self, key: str) -> torch.Tensor:
        """This rank's cyclic rows of ``key`` (empty when it holds no shard)."""
        return self._rows(key, self.shard)

    def saved_piece(self, key: str, rank: int) -> torch.Tensor:
        """This rank's rows of ``key`` in the saved table (empty but on :meth:`holders`)."""
        return self._rows(key, self.saved_shard(rank))


def _sharded(block: torch.Tensor, start: int, shape: tuple[int, ...], group) -> ShardedTensor:
    rank = dist.get_rank(group)
    offsets = [start] + [0] * (len(shape) - 1)
    shards = [Shard.from_tensor_and_offsets(block, offsets, rank)] if block.shape[0] else []
    return ShardedTensor._init_from_local_shards(shards, *shape, process_group=group)


def save_table_state(table: TableState, group: dist.ProcessGroup | None) -> dict[str, Any]:
    """Collective: ``{key: ShardedTensor or tensor}`` of one table, unsharded keys and shapes."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    out: dict[str, Any] = {}
    for key in SPLIT_KEYS:
        shape = table.logical_shape(key)
        if shape[0] == 0:
            empty = (0, table.dim) if key == "cache.rows" else shape
            out[key] = torch.empty(empty, dtype=table.dtype(key))
            continue
        block = cyclic_to_blocks(table.saved_piece(key, rank), table.holders(), shape[0], group)
        start = block_range(shape[0], world, rank)[0]
        if key == "cache.rows":  # the unsharded [S * W, D] rows: set blocks are row blocks
            block, start = block.view(-1, table.dim), start * CACHE_WAYS
            shape = (shape[0] * CACHE_WAYS, table.dim)
        out[key] = _sharded(block, start, shape, group)
    saved = table.saved_shard(rank)
    stats = saved.cache.stats.clone() if saved is not None else torch.zeros(4, dtype=torch.int64)
    dist.all_reduce(stats, group=group)
    out["cache.stats"] = stats
    return out


def _local_block(value: ShardedTensor, key: str, table: TableState) -> torch.Tensor:
    shards = value.local_shards()
    shape = table.logical_shape(key)
    block = shards[0].tensor if shards else torch.empty((0, *shape[1:]), dtype=table.dtype(key))
    return block.reshape(-1, *shape[1:])


def _from_first(piece: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, first: int,
                group: dist.ProcessGroup | None) -> torch.Tensor:  # fmt: skip
    """Collective: rank ``first``'s full ``piece`` of a replicated table on every rank.

    Sent as bytes: gloo broadcasts no int16 (the cache tags).
    """
    full = piece if dist.get_rank(group) == first else torch.empty(shape, dtype=dtype)
    full = full.contiguous()
    dist.broadcast(full.view(torch.uint8), group=group, group_src=first)
    return full


@torch.no_grad()
def load_table_state(
    table: TableState, state: Mapping[str, Any], group: dist.ProcessGroup | None, where: str
) -> None:
    """Collective: set this rank's shard from ``state`` (``save_table_state``'s or full tensors)."""
    for key in SPLIT_KEYS:
        shape, value = table.logical_shape(key), state.get(key)
        if value is None:
            raise ValueError(f"{where}: missing {key!r}")
        expected = (shape[0] * CACHE_WAYS, table.dim) if key == "cache.rows" else shape
        if tuple(value.shape) != expected:
            raise ValueError(f"{where}{key}: shape {tuple(value.shape)} does not match this table")
        if shape[0] == 0:
            continue
        if isinstance(value, ShardedTensor):
            block = _local_block(value, key, table)
            piece = blocks_to_cyclic(block, table.holders(), shape[0], group)
            if table.replicated:
                piece = _from_first(piece, shape, table.dtype(key), table.ranks[0], group)
        elif table.shard is not None:
            j, n = table.ranks.index(dist.get_rank(group)), len(table.holders())
            piece = value.reshape(shape)[j::n] if n > 1 else value.reshape(shape)
        else:
            continue
        if table.shard is not None:
            table.piece(key).copy_(piece)
    if table.shard is not None:
        first = table.replicated or table.ranks[0] == dist.get_rank(group)
        stats = state.get("cache.stats", torch.zeros(4, dtype=torch.int64))
        table.shard.cache.stats.copy_(stats if first else torch.zeros_like(stats))
