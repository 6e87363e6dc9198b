"""Where each table lives: :class:`TablePlacement` and the checks of a collection's plan.

A placement names the ranks that hold a table. One rank holds a whole table
(``table_wise``); several ranks split its rows cyclically (``row_wise`` over every rank,
``table_row_wise`` over the ranks of one host); every rank holds a replica of a small table
(``data_parallel``: each rank admits the global batch, looks up its own samples and applies
the same fused update from per-row gradients summed along the ranks, so the replicas stay
bit-identical); a table with ``k`` column blocks can put block ``b`` on rank
``ranks[b % n]`` (``column_wise``, ``n`` dividing ``k``: the cyclic row split of its
``[R * k, D / k]`` stored rows). Plans are plain data (JSON/YAML), with no TorchRec import;
:mod:`ssl_rec.distributed.sharder` turns them into TorchRec's ``ParameterSharding``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ssl_rec.distributed.cyclic_layout import check_column_split, check_row_split
from ssl_rec.hardware.spec import TableSpec

TABLE_WISE, ROW_WISE, TABLE_ROW_WISE = "table_wise", "row_wise", "table_row_wise"
DATA_PARALLEL, COLUMN_WISE = "data_parallel", "column_wise"
SHARDING_TYPES: tuple[str, ...] = (TABLE_WISE, ROW_WISE, TABLE_ROW_WISE, DATA_PARALLEL,
                                   COLUMN_WISE)  # fmt: skip

__all__ = [
    "COLUMN_WISE",
    "DATA_PARALLEL",
    "ROW_WISE",
    "SHARDING_TYPES",
    "TABLE_ROW_WISE",
    "TABLE_WISE",
    "TablePlacement",
    "check_plan",
    "plan_from_dict",
    "plan_to_dict",
    "uniform_plan",
]


@dataclass(frozen=True)
class TablePlacement:
    """The ranks holding one table.

    Args:
        sharding_type: ``table_wise`` (one rank), ``row_wise`` (all ranks) or
            ``table_row_wise`` (the ranks of one host), rows split cyclically;
            ``data_parallel`` (a whole replica on every rank); or ``column_wise`` (a table
            with ``k`` column blocks, block ``b`` on shard ``b % n``, ``n`` dividing ``k``).
        ranks: Ranks holding the table, in shard order (shard ``j`` holds rows ``g`` with
            ``g % len(ranks) == j``, or the column blocks ``b`` with ``b % len(ranks) == j``);
            every rank ``0..W-1`` for ``data_parallel``.

    Example:
        >>> TablePlacement("row_wise", (0, 1)).num_shards
        2

    """

    sharding_type: str
    ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.sharding_type not in SHARDING_TYPES:
            raise ValueError(
                f"sharding_type={self.sharding_type!r} is not one of {list(SHARDING_TYPES)}"
            )
        ranks = tuple(int(r) for r in self.ranks)
        object.__setattr__(self, "ranks", ranks)
        if not ranks or len(set(ranks)) != len(ranks) or min(ranks) < 0:
            raise ValueError(f"ranks={list(ranks)} must be distinct ranks >= 0, at least one")
        if self.sharding_type == TABLE_WISE and len(ranks) != 1:
            raise ValueError(f"a table_wise table lives on one rank, got ranks={list(ranks)}")

    @property
    def num_shards(self) -> int:
        """Number of shards n (ranks holding a part of the table)."""
        return len(self.ranks)

    @property
    def replicated(self) -> bool:
        """Whether every rank holds the whole table (``data_parallel``)."""
        return self.sharding_type == DATA_PARALLEL

    @property
    def column_split(self) -> bool:
        """Whether the table's column blocks are split over the ranks (``column_wise``)."""
        return self.sharding_type == COLUMN_WISE

    @property
    def row_splits(self) -> int:
        """Parts the rows are split into: 1 for a whole table or a replica, else n."""
        return 1 if self.replicated else len(self.ranks)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: ``{"sharding_type": ..., "ranks": [...]}``."""
        return {"sharding_type": self.sharding_type, "ranks": list(self.ranks)}


def plan_to_dict(plan: Mapping[str, TablePlacement]) -> dict[str, dict[str, Any]]:
    """JSON/YAML form of a plan (table name -> placement dict)."""
    return {name: placement.to_dict() for name, placement in plan.items()}


def plan_from_dict(data: Mapping[str, Any]) -> dict[str, TablePlacement]:
    """Inverse of :func:`plan_to_dict`; also accepts ``TablePlacement`` values."""
    plan = {}
    for name, value in data.items():
        if isinstance(value, TablePlacement):
            plan[str(name)] = value
            continue
        if not isinstance(value, Mapping) or set(value) - {"sharding_type", "ranks"}:
            raise ValueError(
                f"plan entry {name!r}: expected {{sharding_type: ..., ranks: [...]}}, got {value!r}"
            )
        plan[str(name)] = TablePlacement(str(value.get("sharding_type")),
                                         tuple(value.get("ranks", ())))  # fmt: skip
    return plan


def uniform_plan(
    names: Sequence[str], sharding_type: str, world_size: int
) -> dict[str, TablePlacement]:
    """Every table ``row_wise`` over all ranks, or ``table_wise`` round-robin (table i on i % W)."""
    if sharding_type == ROW_WISE:
        return {n: TablePlacement(ROW_WISE, tuple(range(world_size))) for n in names}
    if sharding_type == TABLE_WISE:
        return {n: TablePlacement(TABLE_WISE, (i % world_size,)) for i, n in enumerate(names)}
    raise ValueError(
        f"uniform_plan: sharding_type must be table_wise or row_wise, got {sharding_type!r}"
    )


def check_plan(
    plan: Mapping[str, TablePlacement],
    names: Sequence[str],
    rows: Sequence[int],
    specs: Sequence[TableSpec],
    world_size: int,
) -> dict[str, TablePlacement]:
    """Check that ``plan`` places every table exactly on valid ranks; return it in table order.

    Raises:
        ValueError: naming the table for a missing or unknown table, a rank outside
            ``[0, world_size)``, or a row split that cannot be exact (see
            :func:`~ssl_rec.distributed.cyclic_layout.check_row_split`).

    """
    unknown, missing = sorted(set(plan) - set(names)), [n for n in names if n not in plan]
    if unknown or missing:
        raise ValueError(
            f"sharding plan: unknown tables {unknown}, missing tables {missing}; "
            f"tables are {list(names)}"
        )
    ordered = {}
    for name, num_rows, spec in zip(names, rows, specs, strict=True):
        placement = plan[name]
        bad = [r for r in placement.ranks if r >= world_size]
        if bad:
            raise ValueError(f"table {name!r}: ranks {bad} outside [0, {world_size})")
        if placement.replicated and placement.ranks != tuple(range(world_size)):
            raise ValueError(
                f"table {name!r}: a data_parallel table is replicated on every rank, in order "
                f"(ranks {list(range(world_size))}), got {list(placement.ranks)}"
            )
        if placement.column_split:
            check_column_split(name, num_rows, spec, placement.num_shards)
        elif placement.row_splits > 1:
            if spec.column_blocks > 1:
                raise ValueError(
                    f"table {name!r} has {spec.column_blocks} column blocks: shard it "
                    f"column_wise, table_wise or data_parallel, not {placement.sharding_type}"
                )
            check_row_split(name, num_rows, spec, placement.num_shards)
        ordered[name] = dataclasses.replace(placement)
    return ordered
