"""Sharding plans: TorchRec's planner fed with the library's storage and cost estimates.

``auto`` runs TorchRec's ``EmbeddingShardingPlanner`` over a stand-in of the collection
(shapes only, nothing allocated): its enumerator proposes, per table, every sharding the
table allows exactly (table-wise always; row-wise / table-row-wise when the rows and cache
sets split over the ranks, see :func:`~ssl_rec.distributed.cyclic_layout.check_row_split`), the
library's estimators price each shard (bytes from ``hardware.memory``, kernel and comm time
from :mod:`~ssl_rec.distributed.cost_model`), and its partitioner places shards to balance
the slowest rank. Memory balance comes from the per-rank capacity: the planner is run with
the capacity ``(1 + slack) * total / W`` for growing slack until a plan fits. ``table_wise``
and ``row_wise`` are fixed layouts. YAML/JSON overrides then set any table by hand.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ssl_rec.distributed.cost_model import (
    KernelRates,
    TableInfo,
    default_hit_rate,
    replica_seconds,
    shard_bytes,
    shard_seconds,
)
from ssl_rec.distributed.exact_shardings import allowed_types, column_shards
from ssl_rec.distributed.table_placement import (
    COLUMN_WISE,
    ROW_WISE,
    TABLE_WISE,
    TablePlacement,
    check_plan,
    plan_from_dict,
    plan_to_dict,
)

SHARDING_CHOICES: tuple[str, ...] = ("auto", TABLE_WISE, ROW_WISE)
CAPACITY_SLACK: tuple[float, ...] = (0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 3.0)
PLANNER_BATCH = 4096

__all__ = ["SHARDING_CHOICES", "PlanResult", "plan_collection", "plan_tables", "read_plan_file",
           "tables_of"]  # fmt: skip


@dataclass
class PlanResult:
    """A plan with its per-rank bytes and predicted lookup time.

    Attributes:
        world_size: W.
        placements: Table name -> placement, in table order.
        tables: The planned tables.
        per_rank_bytes: Table bytes per rank (stores, caches, optimizer state).
        per_rank_lookup_s: Predicted kernel seconds per step per rank (batch
            :data:`PLANNER_BATCH` per rank).

    """

    world_size: int
    placements: dict[str, TablePlacement]
    tables: list[TableInfo]
    per_rank_bytes: list[int] = field(default_factory=list)
    per_rank_lookup_s: list[float] = field(default_factory=list)

    @property
    def imbalance(self) -> float:
        """Memory imbalance ``max / mean - 1`` over ranks (0 = perfectly balanced)."""
        return _imbalance(self.per_rank_bytes)

    @property
    def lookup_imbalance(self) -> float:
        """Predicted kernel-time imbalance ``max / mean - 1``."""
        return _imbalance(self.per_rank_lookup_s)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``plan`` is what ``plan_file`` / ``table_overrides`` accept)."""
        return {
            "world_size": self.world_size,
            "plan": plan_to_dict(self.placements),
            "per_rank_bytes": self.per_rank_bytes,
            "imbalance": self.imbalance,
            "per_rank_lookup_seconds": self.per_rank_lookup_s,
            "lookup_imbalance": self.lookup_imbalance,
        }

    def format(self) -> str:
        """A human-readable table: one line per table, then per-rank bytes and imbalance."""
        lines = [f"{'table':<12}{'rows':>12} {'precision':>9} {'cache':>6}  sharding        ranks"]
        for t in self.tables:
            p = self.placements[t.name]
            ranks = _ranks_text(p.ranks)
            spec = t.spec
            lines.append(f"{t.name:<12}{t.rows:>12} {spec.precision.value:>9} "
                         f"{spec.cache_fraction:>6.2%}  {p.sharding_type:<15} {ranks}")  # fmt: skip
        mib = ", ".join(f"{b / 2**20:.1f}" for b in self.per_rank_bytes)
        lines.append(f"per-rank MiB: [{mib}]")
        lines.append(f"memory imbalance (max/mean - 1): {self.imbalance:.2%}; "
                     f"predicted lookup imbalance: {self.lookup_imbalance:.2%}")  # fmt: skip
        return "\n".join(lines)


def _imbalance(values: Sequence[float]) -> float:
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean - 1.0 if mean else 0.0


def _ranks_text(ranks: Sequence[int]) -> str:
    contiguous = list(ranks) == list(range(ranks[0], ranks[0] + len(ranks)))
    return f"{ranks[0]}..{ranks[-1]}" if len(ranks) > 2 and contiguous else str(list(ranks))


def tables_of(collection: Any, hit_rates: Sequence[float] | None = None) -> list[TableInfo]:
    """:class:`TableInfo` of a collection's tables; hit rates from its caches' counters.

    Args:
        collection: A ``MixedPrecisionEmbeddingCollection``.
        hit_rates: Per-table hit rates overriding the counters (e.g. from a data pass).

    """
    stats = collection.cache_stats()
    infos = []
    for i, (name, rows, spec) in enumerate(zip(collection.table_names, collection.cardinalities,
                                               collection.specs, strict=True)):  # fmt: skip
        lookups = stats.get(f"table{i}/hits", 0.0) + stats.get(f"table{i}/misses", 0.0)
        hit = stats[f"table{i}/hit_rate"] if lookups else default_hit_rate(spec)
        hit = hit_rates[i] if hit_rates is not None else hit
        infos.append(TableInfo(name, rows, collection.embedding_dim, spec, float(hit)))
    return infos


def _fixed_plan(
    tables: Sequence[TableInfo], world_size: int, row_wise: bool
) -> dict[str, TablePlacement]:
    """Split over all ranks where exact (if asked), then whole tables on the lightest rank.

    Split: row-wise, or column-wise for a table with column blocks; whole tables go largest
    first.
    """
    plan, load = {}, [0] * world_size
    everyone = tuple(range(world_size))
    for table in tables:
        if not row_wise:
            continue
        if ROW_WISE in allowed_types(table, world_size, world_size):
            plan[table.name] = TablePlacement(ROW_WISE, everyone)
        elif column_shards(table, world_size) == world_size:
            plan[table.name] = TablePlacement(COLUMN_WISE, everyone)
        else:
            continue
        for j in range(world_size):
            load[j] += shard_bytes(table, world_size, j)
    rest = [t for t in tables if t.name not in plan]
    for table in sorted(rest, key=lambda t: (-shard_bytes(t, 1, 0), t.name)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        plan[table.name] = TablePlacement(TABLE_WISE, (rank,))
        load[rank] += shard_bytes(table, 1, 0)
    return {t.name: plan[t.name] for t in tables}


def plan_tables(
    tables: Sequence[TableInfo],
    world_size: int,
    local_world_size: int | None = None,
    sharding: str = "auto",
    overrides: Mapping[str, Any] | None = None,
    rates: KernelRates | None = None,
) -> PlanResult:
    """Plan ``tables`` over ``world_size`` ranks (``local_world_size`` per host).

    Args:
        tables: The tables.
        world_size: W.
        local_world_size: Ranks per host (default W: one host).
        sharding: ``auto`` (TorchRec's planner), ``table_wise`` or ``row_wise``.
        overrides: Table name -> ``{sharding_type, ranks}`` set by hand over the plan.
        rates: Kernel rates for the cost estimates.

    Returns:
        The plan with per-rank bytes and predicted lookup times; deterministic.

    Raises:
        ValueError: unknown ``sharding`` or table names, or an override that cannot be exact.

    """
    if sharding not in SHARDING_CHOICES:
        raise ValueError(f"sharding={sharding!r} is not one of {list(SHARDING_CHOICES)}")
    local = local_world_size or world_size
    rates = rates or KernelRates()
    if world_size == 1:
        placements = {t.name: TablePlacement(TABLE_WISE, (0,)) for t in tables}
    elif sharding == "auto":
        # lazy: TorchRec (seconds to import) only for `auto` plans over several ranks
        from ssl_rec.distributed.torchrec_planner import torchrec_plan

        placements = torchrec_plan(tables, world_size, local, rates, CAPACITY_SLACK, PLANNER_BATCH)
    else:
        placements = _fixed_plan(tables, world_size, sharding == ROW_WISE)
    placements.update(plan_from_dict(overrides or {}))
    return evaluate_plan(tables, placements, world_size, rates)


def evaluate_plan(
    tables: Sequence[TableInfo],
    placements: Mapping[str, TablePlacement],
    world_size: int,
    rates: KernelRates | None = None,
) -> PlanResult:
    """Per-rank bytes and lookup time of ``placements`` (checked as the sharder will)."""
    names = [t.name for t in tables]
    placements = check_plan(placements, names, [t.rows for t in tables],
                            [t.spec for t in tables], world_size)  # fmt: skip
    rates = rates or KernelRates()
    memory, seconds = [0] * world_size, [0.0] * world_size
    for table in tables:
        placement = placements[table.name]
        n = placement.row_splits  # a replica holds the whole table
        if placement.replicated:  # its local batch's lookups, the global batch's unique rows
            cost = replica_seconds(table, world_size, PLANNER_BATCH, rates)
        else:
            cost = shard_seconds(table, n, PLANNER_BATCH * world_size, rates)
        for j, rank in enumerate(placement.ranks):
            memory[rank] += shard_bytes(table, n, j if n > 1 else 0)
            seconds[rank] += cost
    return PlanResult(world_size, dict(placements), list(tables), memory, seconds)


def plan_collection(
    collection: Any,
    world_size: int,
    local_world_size: int,
    sharding: str = "auto",
    overrides: Mapping[str, Any] | None = None,
) -> PlanResult:
    """:func:`plan_tables` for a built collection (hit rates from its cache counters)."""
    return plan_tables(tables_of(collection), world_size, local_world_size, sharding, overrides)


def read_plan_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The table placements of a plan JSON written by ``ssl-rec plan`` (its ``plan`` entry)."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("plan"), dict):
        raise ValueError(f"{path}: not a plan file (expected a JSON object with a 'plan' entry)")
    return dict(data["plan"])
