"""Routing of one-id-per-field lookups between ranks, for a fixed plan.

A rank sends, for every (table, shard) hosted by rank ``r``, the ids of its local samples that
the shard holds: every id of a whole table, the ids ``g`` with ``g % n == j`` of shard ``j``
of a row-split table (as local rows ``g // n``). These are the keys of a KeyedJaggedTensor
ordered by destination rank, as TorchRec's ``KJTAllToAll`` expects. The rows come back by two
TorchRec collectives: whole tables by the pooled-embedding all-to-all (one row per sample and
table), row-split tables by the sequence-embedding all-to-all (one row per sent id, which
returns exactly the ids each rank sent, W times fewer bytes than a reduce-scatter of
per-sample partial sums when every field holds one id). A replicated (``data_parallel``) table
has a key on every rank: the same all-to-all gathers every rank's ids on every rank, where each
replica admits the global batch and looks up its own samples' rows (no rows travel). A
``column_wise`` table sends every id to each of its ``n`` ranks (as the logical id); shard
``j`` returns the ``k / n`` column blocks ``b = j (mod n)`` of the row, ``D / n`` values,
in the same sequence all-to-all. Rows travel there as sub-rows of ``unit`` values (the
narrowest column block's ``D / k``, ``D`` without column-wise tables), so pieces of
different widths share the collective.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from ssl_rec.distributed.table_placement import TablePlacement

__all__ = ["Routing", "SentIds"]


@dataclass
class SentIds:
    """What one rank sent in a step, to put the returned rows back in place.

    Attributes:
        keys: KJT key names, ordered by destination rank.
        lengths: int32[sum over keys of B] per-sample id counts (0 or 1).
        values: int64 local row ids, key-major.
        piece_positions: int64[N * m] output positions, in sub-rows of ``unit`` values
            (``(b * F + t) * D / unit + ...``), of the values of each row-split or
            column-split id sent (``m`` sub-rows per id).
        piece_sent: Sub-rows of pieces coming back from each rank (W ints).

    """

    keys: list[str]
    lengths: torch.Tensor
    values: torch.Tensor
    piece_positions: torch.Tensor
    piece_sent: list[int] = field(default_factory=list)


class Routing:
    """Static routing of a collection's tables under a plan.

    Args:
        names: Table names, in collection order (F tables).
        plan: Table name -> placement.
        world_size: W.
        rank: This rank.
        dim: D.
        blocks: Column blocks per table (default: 1 each).

    Attributes:
        whole: Per rank, the tables it holds whole (table indices, in table order).
        replicated: The tables every rank holds a replica of (in table order).
        pieces: Per rank, its row-split and column-split shards as ``(table, shard index j,
            shards n)``.
        unit: Values per sub-row of the pieces' all-to-all.

    """

    def __init__(
        self,
        names: list[str],
        plan: Mapping[str, TablePlacement],
        world_size: int,
        rank: int,
        dim: int,
        blocks: Sequence[int] | None = None,
    ) -> None:
        self.names, self.world_size, self.rank = list(names), world_size, rank
        self.dim = dim
        self.blocks = [1] * len(names) if blocks is None else [int(k) for k in blocks]
        self.columns = {t for t, name in enumerate(names) if plan[name].column_split}
        # Sub-rows as wide as the narrowest column block: every piece is whole sub-rows.
        self.unit = dim // math.lcm(1, *[self.blocks[t] for t in self.columns])
        self.whole: list[list[int]] = [[] for _ in range(world_size)]
        self.pieces: list[list[tuple[int, int, int]]] = [[] for _ in range(world_size)]
        self.replicated: list[int] = []
        for t, name in enumerate(names):
            ranks = plan[name].ranks
            if plan[name].replicated:
                self.replicated.append(t)
                continue
            if len(ranks) == 1:
                self.whole[ranks[0]].append(t)
                continue
            for j, r in enumerate(ranks):
                self.pieces[r].append((t, j, len(ranks)))
        # Output columns of the pooled all-to-all: each rank's whole tables, rank after rank.
        self.whole_order = torch.tensor([t for ts in self.whole for t in ts], dtype=torch.int64)
        # Columns of the replicas' rows, which stay on this rank (assemble, once per batch).
        self.replica_order = torch.tensor(self.replicated, dtype=torch.int64)
        self.units_per_row = dim // self.unit
        # Per piece: where its sub-rows go in an output row (in sub-rows), and how many.
        self._patterns = {(t, j, n): self._pattern(t, j, n)
                          for ps in self.pieces for t, j, n in ps}  # fmt: skip

    def _pattern(self, t: int, j: int, n: int) -> torch.Tensor:
        """Sub-rows of an output row that piece ``j`` of ``n`` of table ``t`` returns."""
        if t not in self.columns:
            return torch.arange(self.units_per_row, dtype=torch.int64)
        block = self.dim // self.blocks[t] // self.unit  # sub-rows per column block
        starts = [(i * n + j) * block for i in range(self.blocks[t] // n)]
        return torch.tensor([s + u for s in starts for u in range(block)], dtype=torch.int64)

    def piece_units(self, t: int, j: int, n: int) -> int:
        """Sub-rows per id of piece ``j`` of ``n`` of table ``t`` (``D / unit``, or ``/ n``)."""
        return self._patterns[(t, j, n)].numel()

    @property
    def num_tables(self) -> int:
        """F."""
        return len(self.names)

    @property
    def has_whole(self) -> bool:
        """Whether some rank holds a whole table (the pooled all-to-all runs)."""
        return bool(self.whole_order.numel())

    @property
    def has_pieces(self) -> bool:
        """Whether some table is split by rows (the sequence all-to-all runs)."""
        return any(self.pieces)

    @property
    def num_full(self) -> int:
        """Tables this rank looks up for every sample of the global batch (whole + replicas)."""
        return len(self.whole[self.rank]) + len(self.replicated)

    def keys_per_rank(self) -> list[int]:
        """Number of KJT keys each rank receives (the ``KJTAllToAll`` splits)."""
        return [len(w) + len(self.replicated) + len(p)
                for w, p in zip(self.whole, self.pieces, strict=True)]  # fmt: skip

    def route(self, ids: torch.Tensor) -> SentIds:
        """Build this rank's KJT contents for its local batch ``ids`` int64[B, F]."""
        batch, num_tables = ids.shape
        keys, lengths, values, positions = [], [], [], []
        piece_sent = []
        ones = torch.ones(batch, dtype=torch.int32)
        for dest in range(self.world_size):
            sent = 0
            for t in self.whole[dest] + self.replicated:
                keys.append(f"{self.names[t]}@{dest}")
                lengths.append(ones)
                values.append(ids[:, t])
            for t, j, n in self.pieces[dest]:
                keys.append(f"{self.names[t]}@{dest}")
                pattern = self._patterns[(t, j, n)]
                if t in self.columns:  # every id, to every shard
                    lengths.append(ones)
                    values.append(ids[:, t])
                    samples = torch.arange(batch, dtype=torch.int64)
                else:
                    mask = ids[:, t] % n == j
                    lengths.append(mask.to(torch.int32))
                    values.append(ids[mask, t] // n)
                    samples = mask.nonzero().squeeze(1)
                first = (samples * num_tables + t) * self.units_per_row
                positions.append((first[:, None] + pattern[None, :]).reshape(-1))
                sent += samples.numel() * pattern.numel()
            piece_sent.append(sent)
        return SentIds(
            keys=keys,
            lengths=torch.cat(lengths) if lengths else torch.zeros(0, dtype=torch.int32),
            values=torch.cat(values) if values else torch.zeros(0, dtype=torch.int64),
            piece_positions=torch.cat(positions)
            if positions
            else torch.zeros(0, dtype=torch.int64),
            piece_sent=piece_sent,
        )

    def split_received(
        self, values: torch.Tensor, lengths: torch.Tensor, global_batch: int
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
        """Split the ids this rank received into its shards' ids.

        Args:
            values: int64 received local ids, key-major (this rank's keys in routing order).
            lengths: int32[keys * global_batch] per-sample counts.
            global_batch: B_global, the sum of the ranks' batches.

        Returns:
            ``(full_ids int64[B_global, T_whole + T_replicated] (whole tables, then
            replicas), piece ids per shard, sub-rows of pieces each rank gets back)``.

        """
        full, pieces = self.num_full, self.pieces[self.rank]
        per_key = lengths.view(full + len(pieces), global_batch)
        counts = per_key.sum(1).tolist()
        chunks = list(values.split([int(c) for c in counts]))
        full_ids = (torch.stack(chunks[:full], 1) if full
                    else torch.zeros(global_batch, 0, dtype=torch.int64))  # fmt: skip
        received = [0] * self.world_size
        if pieces:
            by_source = per_key[full:].view(len(pieces), self.world_size, -1).sum(2)
            units = torch.tensor([self.piece_units(*p) for p in pieces], dtype=by_source.dtype)
            received = (by_source * units[:, None]).sum(0).tolist()
        return full_ids.contiguous(), [c.contiguous() for c in chunks[full:]], received

    def piece_lengths(self, lengths: torch.Tensor, global_batch: int) -> torch.Tensor:
        """Sub-rows per (piece key, sample) of this rank's received piece ids.

        Args:
            lengths: int32[keys * B_global] per-sample counts received (full keys first).
            global_batch: B_global.

        Returns:
            int32[pieces, B_global], what the sequence all-to-all permutes by.

        """
        pieces = self.pieces[self.rank]
        per_key = lengths[self.num_full * global_batch :].view(-1, global_batch)
        if not self.columns:
            return per_key
        units = torch.tensor([self.piece_units(*p) for p in pieces], dtype=per_key.dtype)
        return per_key * units[:, None]

    def assemble(
        self,
        whole_rows: torch.Tensor,
        piece_rows: torch.Tensor,
        sent: SentIds,
        batch: int,
        dim: int,
        replica_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Put the returned rows in field order: float32[B, F, D].

        Args:
            whole_rows: float32[B, T_whole_all * D] from the pooled all-to-all (columns per
                rank, in ``whole_order``).
            piece_rows: float32[N * m, unit] from the sequence all-to-all, in the order sent.
            sent: What this rank sent.
            batch: Local batch B.
            dim: D.
            replica_rows: float32[B, T_replicated, D], this rank's samples' rows of the
                replicated tables (looked up here).

        """
        num_tables, unit, per_row = self.num_tables, self.unit, self.units_per_row
        samples = torch.arange(batch, dtype=torch.int64)[:, None] * num_tables
        whole_pos = (samples + self.whole_order[None, :]).reshape(-1)
        replica_pos = (samples + self.replica_order[None, :]).reshape(-1)
        if per_row > 1:  # each row is per_row sub-rows
            steps = torch.arange(per_row, dtype=torch.int64)
            whole_pos = (whole_pos[:, None] * per_row + steps).reshape(-1)
            replica_pos = (replica_pos[:, None] * per_row + steps).reshape(-1)
        if replica_rows is None:
            replica_rows = torch.zeros(0, dim)
        positions = torch.cat([whole_pos, replica_pos, sent.piece_positions])
        rows = torch.cat([whole_rows.reshape(-1, unit), replica_rows.reshape(-1, unit),
                          piece_rows.reshape(-1, unit)])  # fmt: skip
        order = torch.empty_like(positions)
        order[positions] = torch.arange(positions.numel(), dtype=torch.int64)
        return rows[order].view(batch, num_tables, dim)
