"""The unsharded collection's surface on a sharded collection: table controls, state, gathers.

Everything the models and checkpoints call on a ``MixedPrecisionEmbeddingCollection``
(specs, freezing, learning rate, weight loading, ``state_dict``, statistics) behaves the same
on a sharded one. Methods that need other ranks' rows are collectives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ssl_rec.distributed.state import TableState, load_table_state, save_table_state
from ssl_rec.hardware.collection import MixedPrecisionEmbeddingCollection
from ssl_rec.hardware.column_blocks import expand_ids
from ssl_rec.hardware.kernels.dispatch import get_kernels
from ssl_rec.hardware.memory import summarize
from ssl_rec.hardware.table import EmbeddingTable
from ssl_rec.hardware.table_group import check_table_ids

__all__ = ["CollectionSurface"]


class CollectionSurface:
    """Mixin of the sharded collection: the unsharded collection's methods.

    Needs the sharded module's ``plan``, ``routing``, ``shards``, ``ahead`` and ``_pg``.
    """

    def _init_surface(self, module: MixedPrecisionEmbeddingCollection) -> None:
        self.cardinalities = list(module.cardinalities)
        self.embedding_dim = module.embedding_dim
        self.specs = list(module.specs)
        self.table_names = list(module.table_names)
        self.frozen = bool(module.frozen)
        self.seed = module.group.seed
        self._limits = torch.tensor(self.cardinalities, dtype=torch.int64)

    @property
    def num_tables(self) -> int:
        """Number of tables F."""
        return len(self.cardinalities)

    def check_ids(self, ids: torch.Tensor) -> None:
        """Raise for ids that are not ``int64[B, F]`` within the cardinalities (names the table)."""
        check_table_ids(ids, self._limits)

    def _shard_of(self, table: int) -> tuple[EmbeddingTable | None, int, int]:
        """(this rank's shard or replica of ``table`` or None, its index j, row splits n)."""
        placement = self.plan[self.table_names[table]]
        ranks, rank = placement.ranks, self.routing.rank
        if rank not in ranks:
            return None, 0, len(ranks)
        whole = self.routing.whole[rank]
        if placement.replicated:
            return self.shards.tables[len(whole) + self.routing.replicated.index(table)], 0, 1
        if len(ranks) == 1:
            return self.shards.tables[whole.index(table)], 0, 1
        k = [t for t, _, _ in self.routing.pieces[rank]].index(table)
        full = self.routing.num_full
        return self.shards.tables[full + k], ranks.index(rank), len(ranks)

    def _gathered_shard(self, table: int) -> tuple[EmbeddingTable | None, int, int]:
        """:meth:`_shard_of` for gathers: a replicated table counts on its first rank only."""
        placement = self.plan[self.table_names[table]]
        if placement.replicated and self.routing.rank != placement.ranks[0]:
            return None, 0, 1
        return self._shard_of(table)

    def _table_state(self, table: int) -> TableState:
        name, spec = self.table_names[table], self.specs[table]
        rows, width = spec.stored_shape(self.cardinalities[table], self.embedding_dim)
        return TableState(rows, width, spec, self.plan[name], self._shard_of(table)[0])

    # Table controls.

    def set_learning_rate(self, learning_rate: float) -> None:
        """Use ``learning_rate`` (> 0) for every table's fused optimizer."""
        if not learning_rate > 0:
            raise ValueError(f"learning_rate={learning_rate!r} must be > 0")
        if self.shards.group is not None:
            self.shards.group.set_learning_rate(learning_rate)
        self.specs = [
            dataclasses.replace(s, learning_rate=float(learning_rate)) for s in self.specs
        ]

    def reset_optimizer_state(self) -> None:
        """Zero every shard's row-wise Adagrad accumulator."""
        for table in self.shards.tables:
            table.momentum.zero_()

    @torch.no_grad()
    def load_float(self, table: int, weight: torch.Tensor) -> None:
        """Quantize the full float32[R, D] ``weight`` of ``table``; each rank keeps its rows."""
        shard, j, n = self._shard_of(table)
        if tuple(weight.shape) != (self.cardinalities[table], self.embedding_dim):
            raise ValueError(f"weight shape {tuple(weight.shape)} does not match table {table}")
        if shard is not None:
            stored = self.specs[table].stored_shape(*weight.shape)  # column blocks as rows
            shard.load_float(weight.reshape(stored)[j::n])

    def load_weights(self, weights: Sequence[torch.Tensor]) -> None:
        """Quantize one full float32 ``[R, D]`` weight per table (row-wise quantization)."""
        if len(weights) != self.num_tables:
            raise ValueError(f"got {len(weights)} weights for {self.num_tables} tables")
        for index, weight in enumerate(weights):
            self.load_float(index, weight)

    # Gathers (collectives).

    @torch.no_grad()
    def dequantize_rows(self, table: int, ids: torch.Tensor) -> torch.Tensor:
        """Collective: float32[n, D] current values of rows ``ids`` int64[n] (same on all ranks)."""
        ids = ids.to(torch.int64).reshape(-1)
        if bool(((ids < 0) | (ids >= self.cardinalities[table])).any()):
            raise IndexError(f"table {table}: ids outside [0, {self.cardinalities[table]})")
        out = torch.zeros(ids.numel(), self.embedding_dim)
        shard, j, n = self._gathered_shard(table)
        if shard is not None and self.specs[table].column_blocks > 1:
            # every id: this shard's column blocks b = j (mod n), per = k / n of them
            tensors = self.shards.group.tensors([self.shards.tables.index(shard)])
            per = shard.rows_per_id
            rows = get_kernels().forward(tensors, expand_ids(ids.reshape(-1, 1), per))
            out.view(ids.numel(), per, n, -1)[:, :, j] = rows.view(ids.numel(), per, -1)
        elif shard is not None:
            mine = ids % n == j
            k = self.shards.tables.index(shard)
            local = (ids[mine] // n).reshape(-1, 1).contiguous()
            out[mine] = get_kernels().forward(self.shards.group.tensors([k]), local)[:, 0, :]
        dist.all_reduce(out, group=self._pg)
        return out

    def float_weights(self) -> list[torch.Tensor]:
        """Collective: every table's full FP32 ``[R, D]`` weights (cache included) on every rank."""
        return [self.dequantize_rows(t, torch.arange(r)) for t, r in enumerate(self.cardinalities)]

    def unshard(self) -> MixedPrecisionEmbeddingCollection:
        """Collective: the unsharded collection with this one's exact state, on every rank."""
        state = {}
        for key, value in self.state_dict().items():
            if hasattr(value, "local_shards"):
                full = torch.zeros(value.size(), dtype=value.dtype)
                for shard in value.local_shards():
                    offsets = shard.metadata.shard_offsets
                    full[offsets[0] : offsets[0] + shard.tensor.shape[0]] = shard.tensor
                dist.all_reduce(full.view(torch.uint8), group=self._pg)
                value = full
            state[key] = value
        return MixedPrecisionEmbeddingCollection.from_state_dict(state)

    # State: the unsharded collection's keys and shapes.

    def get_extra_state(self) -> dict:
        """The unsharded collection's ``_extra_state`` (cardinalities, D, specs, seed)."""
        return {"cardinalities": list(self.cardinalities), "embedding_dim": self.embedding_dim,
                "specs": [s.to_dict() for s in self.specs], "seed": self.seed}  # fmt: skip

    def matches_state(self, state: Mapping[str, Any]) -> bool:
        """Whether ``state`` holds tables in this collection's formats."""
        return MixedPrecisionEmbeddingCollection.matches_state(self, state)

    def weights_from_state(self, state: Mapping[str, Any]) -> list[torch.Tensor]:
        """FP32 ``[R, D]`` weights of the (unsharded) tables saved in ``state``."""
        return MixedPrecisionEmbeddingCollection.from_state_dict(state).float_weights()

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        destination[prefix + "_extra_state"] = self.get_extra_state()
        step = self.shards.step.clone()
        dist.all_reduce(step, op=dist.ReduceOp.MAX, group=self._pg)
        destination[prefix + "group.step"] = step
        for t in range(self.num_tables):
            for key, value in save_table_state(self._table_state(t), self._pg).items():
                destination[f"{prefix}group.tables.{t}.{key}"] = value

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        ours = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
        if not self.matches_state(ours):
            error_msgs.append(f"{prefix}: saved tables have other formats than this collection")
            return
        if "group.step" in ours:
            self.shards.step.copy_(ours["group.step"])
        for t in range(self.num_tables):
            head = f"group.tables.{t}."
            sub = {k[len(head) :]: v for k, v in ours.items() if k.startswith(head)}
            load_table_state(self._table_state(t), sub, self._pg, f"{prefix}{head}")
        known = {"_extra_state", "group.step"}
        unexpected_keys.extend(
            prefix + k for k in ours if k not in known and not k.startswith("group.tables.")
        )

    # Reports: this rank's shards.

    def memory_report(self) -> dict:
        """Bytes of this rank's shards (``memory_report()`` format)."""
        return summarize([t.memory() for t in self.shards.tables])

    def cache_stats(self) -> dict[str, float]:
        """Cache statistics of this rank's shards (``cache_stats()`` format, local tables)."""
        if self.shards.group is None:
            return {"hit_rate": 0.0, "hits": 0.0, "misses": 0.0, "evictions": 0.0}
        stats = self.shards.group.cache_stats()
        stats["prefetch_used"] = float(self.ahead.used)  # input dists run ahead, not admissions
        stats["prefetch_discarded"] = float(self.ahead.discarded)
        return stats
