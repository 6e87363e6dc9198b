"""Cyclic row-wise layout: which rows, cache sets and state a shard of a table holds.

Row ``g`` of a table split over ``n`` shards lives on shard ``g % n`` as local row ``g // n``.
When the table's ``S`` cache sets divide by ``n``, set ``s`` (the rows ``g = s (mod S)``) lands
whole on shard ``s % n`` as local set ``s // n`` with the same tags (``g // S``): every shard
caches exactly the rows the unsplit table would, in the same ways. With the stochastic-rounding
RNG keyed by global row (:class:`~ssl_rec.hardware.table.RowShard`), a sharded table therefore
trains bit for bit like the unsplit one. Cyclic rows also spread a frequency-sorted
vocabulary's hot ids evenly over the shards, where contiguous row blocks would put them all
on the first.
"""

from __future__ import annotations

import torch

from ssl_rec.hardware.cache import cache_geometry
from ssl_rec.hardware.spec import TableSpec
from ssl_rec.hardware.table import EmbeddingTable, RowShard

__all__ = ["check_column_split", "check_row_split", "shard_rows", "split_table", "table_pieces"]

# The tensors of a table that are split by rows, and those split by cache sets.
ROW_TENSORS: tuple[str, ...] = ("store", "momentum")
SET_TENSORS: tuple[str, ...] = ("cache.rows", "cache.tags", "cache.state")


def shard_rows(num_rows: int, n: int, j: int) -> int:
    """Rows of shard ``j`` of a ``num_rows``-row table split cyclically over ``n`` shards."""
    return (num_rows - j + n - 1) // n


def check_row_split(name: str, num_rows: int, spec: TableSpec, n: int) -> None:
    """Raise ``ValueError`` unless table ``name`` splits row-wise over ``n`` shards exactly.

    Args:
        name: Table name (for the message).
        num_rows: Rows R of the logical table.
        spec: Its spec (cache geometry).
        n: Number of shards.

    """
    if n > num_rows:
        raise ValueError(f"table {name!r}: {num_rows} rows cannot be split over {n} shards")
    sets = cache_geometry(num_rows, spec)
    if sets % n:
        raise ValueError(
            f"table {name!r}: its {sets} cache sets do not divide among {n} row-wise shards "
            "(each shard must hold whole sets to cache what one process would); shard it "
            "table-wise, over a power-of-two number of ranks, or give it more cache rows"
        )


def check_column_split(name: str, num_rows: int, spec: TableSpec, n: int) -> None:
    """Raise ``ValueError`` unless table ``name`` splits column-wise over ``n`` shards exactly.

    Block ``b`` of a table with ``k`` column blocks lives on shard ``b % n``: with the
    blocks stored as rows ``r * k + b`` (:mod:`~ssl_rec.hardware.column_blocks`), that is the
    cyclic row split of the ``R * k`` stored rows when ``n`` divides ``k``, exact when the
    stored rows' cache sets divide by ``n`` (:func:`check_row_split`).

    Args:
        name: Table name (for the message).
        num_rows: Rows R of the logical table.
        spec: Its spec (column blocks, cache geometry).
        n: Number of shards.

    """
    k = spec.column_blocks
    if k == 1:
        raise ValueError(
            f"table {name!r}: column_wise needs column blocks (TableSpec.column_blocks > 1), "
            "it has 1; shard it row_wise or table_wise, or give it column blocks"
        )
    if k % n:
        raise ValueError(
            f"table {name!r}: its {k} column blocks do not divide among {n} column-wise "
            f"shards; place it on a number of ranks that divides {k}"
        )
    check_row_split(name, num_rows * k, spec, n)


def row_shard(num_rows: int, spec: TableSpec, n: int, j: int) -> RowShard:
    """The :class:`RowShard` of shard ``j`` of ``n`` (checked with :func:`check_row_split`)."""
    return RowShard(offset=j, stride=n, cache_sets=cache_geometry(num_rows, spec) // n)


def _set_view(tensor: torch.Tensor, sets: int) -> torch.Tensor:
    """``[S, ...]`` view of a per-slot or per-set cache tensor (cache rows are ``[S * W, D]``)."""
    return tensor.view(sets, -1) if sets else tensor


def table_pieces(table: EmbeddingTable) -> dict[str, torch.Tensor]:
    """A table's split tensors by state-dict name, each with rows or sets as dimension 0.

    ``cache.rows`` is viewed as ``[S, W * D]`` so that every tensor splits along dim 0.
    """
    sets = table.cache.sets
    return {
        "store": table.store,
        "momentum": table.momentum,
        "cache.rows": _set_view(table.cache.rows, sets),
        "cache.tags": table.cache.tags,
        "cache.state": table.cache.state,
    }


@torch.no_grad()
def split_table(
    table: EmbeddingTable, n: int, j: int, init: tuple[float, int] | None = None
) -> EmbeddingTable:
    """Shard ``j`` of ``n`` of ``table``: its cyclic rows, cache sets and optimizer state.

    Only the shard's rows are allocated. A declared table (meta device) gives a fresh shard
    initialized from ``init``: the rows the whole table would have been initialized with
    (``EmbeddingTable.init_normal``), an empty cache and zero optimizer state.

    Args:
        table: A whole logical table (``RowShard()``), left unchanged.
        n: Number of shards (``n == 1`` copies the table).
        j: This shard's index.
        init: ``(std, seed)`` of the collection's initialization (needed for a declared
            table).

    Returns:
        A new table; the statistics counters go to shard 0 so their sum is unchanged.

    """
    check_row_split(table.name, table.num_rows, table.spec, n)
    rows = shard_rows(table.num_rows, n, j)
    shard = EmbeddingTable(rows, table.dim, table.spec, table.stream,
                           shard=row_shard(table.num_rows, table.spec, n, j),
                           name=table.name)  # fmt: skip
    if table.declared:
        if init is None:
            raise ValueError(f"table {table.name!r} is declared only: give its init (std, seed)")
        shard.init_normal(*init, logical_rows=table.num_rows)
        return shard
    mine, whole = table_pieces(shard), table_pieces(table)
    for key, piece in mine.items():
        source = whole[key]
        piece.copy_(source[j::n] if source.shape[0] else source)
    if j == 0:
        shard.cache.stats.copy_(table.cache.stats)
    return shard
