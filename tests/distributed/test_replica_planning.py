"""The planners offer ``data_parallel`` for small tables and price replicas as they train.

A replica looks up and updates the whole global batch on every rank (no rows travel
forward, backward gathers the gradients): TorchRec's planner replicates a small table when
that lowers the slowest rank's time, and keeps small tables whole where spreading them over
the ranks is cheaper.
"""

from __future__ import annotations

import pytest

from ssl_rec.data import CRITEO_KAGGLE_CARDINALITIES
from ssl_rec.distributed.cost_model import TableInfo, default_hit_rate, shard_bytes, step_cost
from ssl_rec.distributed.exact_shardings import REPLICA_MAX_BYTES, allowed_types
from ssl_rec.distributed.planner import plan_tables
from ssl_rec.hardware import TableSpec

INT8 = TableSpec("int8", 0.05)


def _table(name: str, rows: int) -> TableInfo:
    return TableInfo(name, rows, 16, INT8, default_hit_rate(INT8))


def test_only_small_tables_on_several_ranks_may_be_replicated() -> None:
    tiny, big = _table("tiny", 4), _table("big", 1 << 20)
    assert shard_bytes(tiny, 1, 0) <= REPLICA_MAX_BYTES < shard_bytes(big, 1, 0)
    assert "data_parallel" in allowed_types(tiny, 8, 8)
    assert "data_parallel" not in allowed_types(big, 8, 8)
    assert "data_parallel" not in allowed_types(tiny, 1, 1)


def test_auto_replicates_a_small_table_that_would_make_one_rank_the_slowest() -> None:
    pytest.importorskip("torchrec")
    tables = [_table("big", 1 << 20), _table("tiny", 4)]
    plan = plan_tables(tables, 8)
    assert plan.placements["big"].sharding_type == "row_wise"
    assert plan.placements["tiny"].sharding_type == "data_parallel"
    assert plan.placements["tiny"].ranks == tuple(range(8))
    replica = shard_bytes(tables[1], 1, 0)  # a whole replica on every rank
    row_split = [shard_bytes(tables[0], 8, j) for j in range(8)]
    assert plan.per_rank_bytes == [b + replica for b in row_split]
    assert plan.lookup_imbalance == pytest.approx(0.0, abs=1e-9)
    whole = plan_tables(tables, 8, overrides={"tiny": {"sharding_type": "table_wise",
                                                       "ranks": [3]}})  # fmt: skip
    cost = {name: step_cost(tables, p.placements, 8, 4096, 0)["parts"]["rows_a2a_s"]
            for name, p in (("replica", plan), ("whole", whole))}  # fmt: skip
    assert cost["replica"] < cost["whole"]  # no rows of the replica travel forward


def test_criteo_kaggles_small_tables_stay_whole_where_spreading_them_is_cheaper() -> None:
    pytest.importorskip("torchrec")
    tables = [_table(f"C{i + 1}", rows) for i, rows in enumerate(CRITEO_KAGGLE_CARDINALITIES)]
    plan = plan_tables(tables, 8)
    small = [t.name for t in tables if "data_parallel" in allowed_types(t, 8, 8)]
    assert len(small) >= 10  # offered ...
    # ... but 16 small tables spread over 8 ranks cost each rank 2 tables' kernels, where
    # replicas would cost each rank all 16 (a replica trains the global batch)
    assert not any(plan.placements[n].replicated for n in small)
