"""Column-wise placements: checked with clear errors, offered and priced by the planners."""

from __future__ import annotations

import pytest

from ssl_rec.data import CRITEO_KAGGLE_CARDINALITIES
from ssl_rec.distributed.cost_model import TableInfo, default_hit_rate, shard_bytes, step_cost
from ssl_rec.distributed.exact_shardings import allowed_types, column_shards
from ssl_rec.distributed.planner import plan_tables
from ssl_rec.distributed.table_placement import TablePlacement, check_plan
from ssl_rec.hardware import TableSpec, estimate_memory

INT8 = TableSpec("int8", 0.05)
BLOCKED = TableSpec("int8", 0.05, column_blocks=4)


def _table(name: str, rows: int, spec: TableSpec = INT8, dim: int = 64) -> TableInfo:
    return TableInfo(name, rows, dim, spec, default_hit_rate(spec))


def _check(placement: TablePlacement, spec: TableSpec, world: int = 4) -> None:
    check_plan({"t": placement}, ["t"], [100_000], [spec], world)


def test_column_wise_placements_are_checked_with_the_table_name() -> None:
    _check(TablePlacement("column_wise", (3, 1)), BLOCKED)
    _check(TablePlacement("column_wise", (0, 1, 2, 3)), BLOCKED)
    with pytest.raises(ValueError, match="table 't': column_wise needs column blocks"):
        _check(TablePlacement("column_wise", (0, 1)), INT8)
    with pytest.raises(ValueError, match="table 't': its 4 column blocks do not divide among 3"):
        _check(TablePlacement("column_wise", (0, 1, 2)), BLOCKED)
    with pytest.raises(ValueError, match="table 't' has 4 column blocks: shard it column_wise"):
        _check(TablePlacement("row_wise", (0, 1, 2, 3)), BLOCKED)
    with pytest.raises(ValueError, match="ranks \\[4\\] outside"):
        _check(TablePlacement("column_wise", (0, 4)), BLOCKED)


def test_column_shards_bytes_and_allowed_types() -> None:
    big = _table("big", 200_000, BLOCKED)
    assert column_shards(big, 8) == 4 and column_shards(big, 2) == 2
    assert column_shards(big, 1) == 0 and column_shards(_table("p", 200_000), 8) == 0
    assert "column_wise" in allowed_types(big, 8, 8)
    assert "row_wise" not in allowed_types(big, 8, 8)
    assert "column_wise" not in allowed_types(_table("plain", 200_000), 8, 8)
    whole = estimate_memory([200_000], 64, BLOCKED)["total"]
    assert shard_bytes(big, 1, 0) == whole["total_bytes"] + whole["optimizer_state"]
    # the shards split the stored rows; each adds only its cache's fixed counters
    assert 0 <= sum(shard_bytes(big, 4, j) for j in range(4)) - shard_bytes(big, 1, 0) < 1024


def test_column_wise_costs_rows_like_row_wise_and_ids_to_every_shard() -> None:
    plain, blocked = _table("t", 200_000), _table("t", 200_000, BLOCKED)
    row = step_cost([plain], {"t": TablePlacement("row_wise", (0, 1, 2, 3))}, 4, 1024, 0)
    col = step_cost([blocked], {"t": TablePlacement("column_wise", (0, 1, 2, 3))}, 4, 1024, 0)
    assert col["parts"]["kernels_s"] == row["parts"]["kernels_s"]
    assert col["parts"]["rows_a2a_s"] == row["parts"]["rows_a2a_s"]
    assert col["parts"]["ids_a2a_s"] > row["parts"]["ids_a2a_s"]


def test_overrides_and_the_planners_place_blocked_tables_column_wise() -> None:
    tables = [_table("a", 300_000, BLOCKED), _table("b", 50_000)]
    plan = plan_tables(tables, 4, sharding="row_wise")
    assert plan.placements["a"] == TablePlacement("column_wise", (0, 1, 2, 3))
    assert plan.placements["b"].sharding_type == "row_wise"
    overrides = {"a": {"sharding_type": "column_wise", "ranks": [2, 0]}}
    plan = plan_tables(tables, 4, sharding="table_wise", overrides=overrides)
    assert plan.placements["a"] == TablePlacement("column_wise", (2, 0))
    half = shard_bytes(tables[0], 2, 0)
    assert plan.per_rank_bytes[2] >= half and plan.per_rank_bytes[0] >= half


@pytest.mark.parametrize("world", [8, 128])
def test_auto_splits_blocked_criteo_tables_column_wise(world: int) -> None:
    pytest.importorskip("torchrec")
    blocked = {"C10", "C24", "C26"}
    tables = [_table(f"C{i + 1}", rows, BLOCKED if f"C{i + 1}" in blocked else INT8)
              for i, rows in enumerate(CRITEO_KAGGLE_CARDINALITIES)]  # fmt: skip
    plan = plan_tables(tables, world)
    types = {n: p.sharding_type for n, p in plan.placements.items()}
    assert "column_wise" in {types[n] for n in blocked}
    assert all(types[n] in ("column_wise", "table_wise", "data_parallel") for n in blocked)
    for name in blocked:
        if types[name] == "column_wise":
            assert len(set(plan.placements[name].ranks)) == len(plan.placements[name].ranks)
