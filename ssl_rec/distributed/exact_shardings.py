"""Which shardings of a table are exact on a topology: whole cache sets on every shard.

Shared by the fixed layouts of :mod:`~ssl_rec.distributed.planner` and the constraints it
hands TorchRec's planner in :mod:`~ssl_rec.distributed.torchrec_planner` (which imports
TorchRec, so it lives apart and the planner imports it only for ``auto`` plans).
"""

from __future__ import annotations

from ssl_rec.distributed.cost_model import TableInfo, shard_bytes
from ssl_rec.distributed.table_placement import (
    COLUMN_WISE,
    DATA_PARALLEL,
    ROW_WISE,
    TABLE_ROW_WISE,
    TABLE_WISE,
)
from ssl_rec.hardware.cache import cache_geometry

__all__ = ["REPLICA_MAX_BYTES", "allowed_types", "column_shards"]

# A replica is whole on every rank: offered for tables up to this size (store, cache and
# optimizer state), where W copies cost little memory.
REPLICA_MAX_BYTES = 1 << 20


def column_shards(table: TableInfo, world_size: int) -> int:
    """Ranks ``n`` a column-wise split of ``table`` uses on ``world_size`` ranks (0: none).

    The most ranks, up to W, that divide the table's column blocks ``k`` and its stored
    rows' cache sets (so that the split is exact); 0 for a table without blocks.
    """
    k = table.spec.column_blocks
    rows = table.rows * k
    sets = cache_geometry(rows, table.spec)
    fits = [n for n in range(2, min(k, world_size) + 1)
            if k % n == 0 and rows >= n and sets % n == 0]  # fmt: skip
    return max(fits, default=0)


def allowed_types(table: TableInfo, world_size: int, local_world_size: int) -> list[str]:
    """Shardings of ``table`` that are exact (whole cache sets per shard) on this topology.

    Args:
        table: The table (rows and precision spec).
        world_size: W, the ranks in all.
        local_world_size: Ranks per host.

    Returns:
        ``table_wise`` always; ``row_wise`` when the rows and cache sets split over W ranks;
        ``table_row_wise`` when there are several hosts and they split over a host's ranks;
        for a table with column blocks, ``column_wise`` (over :func:`column_shards` ranks)
        instead of both;
        ``data_parallel`` (a replica on every rank) for tables of at most
        :data:`REPLICA_MAX_BYTES` on several ranks (replicas admit the same global batch
        and apply the same all-reduced update, so they always stay identical).

    """
    types = [TABLE_WISE]
    if table.spec.column_blocks > 1:
        if column_shards(table, world_size):
            types.append(COLUMN_WISE)
        if world_size > 1 and shard_bytes(table, 1, 0) <= REPLICA_MAX_BYTES:
            types.append(DATA_PARALLEL)
        return types
    sets = cache_geometry(table.rows, table.spec)
    if world_size > 1 and table.rows >= world_size and sets % world_size == 0:
        types.append(ROW_WISE)
    hosts = world_size // local_world_size if local_world_size else 1
    if (
        hosts > 1
        and local_world_size > 1
        and world_size % local_world_size == 0
        and (table.rows >= local_world_size and sets % local_world_size == 0)
    ):
        types.append(TABLE_ROW_WISE)
    if world_size > 1 and shard_bytes(table, 1, 0) <= REPLICA_MAX_BYTES:
        types.append(DATA_PARALLEL)
    return types
