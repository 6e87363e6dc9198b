"""The planners offer ``data_parallel`` for small tables and price replicas as they train.

A replica dedupes and admits the global batch's ids, looks up its local batch and updates
the batch's unique rows, whose ``[U, D]`` gradient one all-reduce sums (no rows travel):
its cost grows with the global batch only through the dedup and ``U <= rows``. TorchRec's
planner replicates a small table when that lowers the slowest rank's time.
"""

from __future__ import annotations

import pytest

from ssl_rec.data import CRITEO_KAGGLE_CARDINALITIES
from ssl_rec.distributed.cost_model import (
    KernelRates,
    Network,
    TableInfo,
    default_hit_rate,
    replica_chain_hops,
    replica_seconds,
    shard_bytes,
    shard_seconds,
    step_cost,
    unique_rows,
)
from ssl_rec.distributed.exact_shardings import REPLICA_MAX_BYTES, allowed_types
from ssl_rec.distributed.planner import PLANNER_BATCH, plan_tables
from ssl_rec.distributed.table_placement import TablePlacement
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


def test_a_replica_costs_its_local_batch_and_unique_rows() -> None:
    tiny, rates = _table("tiny", 4), KernelRates()
    assert unique_rows(4, 10**6) == pytest.approx(4.0) and unique_rows(10**6, 3) < 3.0
    # 16x the ranks: a whole table's work grows 16x, a replica's only by the ids' dedup
    small, large = (replica_seconds(tiny, w, 4096, rates) for w in (8, 128))
    assert large - small == pytest.approx(120 * 4096 * rates.dedup_ns * 1e-9)
    assert shard_seconds(tiny, 1, 128 * 4096, rates) > 40 * large
    tables = [_table("big", 1 << 20), tiny]
    plan = {"big": TablePlacement("row_wise", tuple(range(8))),
            "tiny": TablePlacement("data_parallel", tuple(range(8)))}  # fmt: skip
    cost = step_cost(tables, plan, 8, 4096, 0)
    assert cost["replica_grad_bytes"] == pytest.approx(4 * 16 * 4)  # [U, D] FP32
    # 7 hops along the ranks, 3 of the broadcast, each a message of [U, D]
    assert replica_chain_hops(8) == 10 and replica_chain_hops(2) == 2 and replica_chain_hops(1) == 0
    network = Network()
    hop = network.latency_us * 1e-6 + 4 * 16 * 4 / (network.bandwidth_gb_s * 1e9)
    assert cost["parts"]["replica_chain_s"] == pytest.approx(10 * hop)


def _criteo() -> list[TableInfo]:
    return [_table(f"C{i + 1}", rows) for i, rows in enumerate(CRITEO_KAGGLE_CARDINALITIES)]


def test_criteo_kaggles_tiny_tables_are_replicated_on_8_ranks() -> None:
    pytest.importorskip("torchrec")
    tables = _criteo()
    plan = plan_tables(tables, 8)
    replicated = {n for n, p in plan.placements.items() if p.replicated}
    # every table up to 3194 rows; the larger offered ones (5652-14992 rows) split row-wise
    assert replicated == {t.name for t in tables if t.rows <= 3194}
    assert len(replicated) == 14
    assert all(p.sharding_type == "row_wise" for n, p in plan.placements.items()
               if n not in replicated)  # fmt: skip
    assert plan.lookup_imbalance == pytest.approx(0.0, abs=1e-9)
    # the same tables whole, spread over the ranks, leave the slowest rank slower
    spread = {n: {"sharding_type": "table_wise", "ranks": [i % 8]}
              for i, n in enumerate(sorted(replicated))}  # fmt: skip
    whole = plan_tables(tables, 8, overrides=spread)
    assert max(plan.per_rank_lookup_s) < 0.85 * max(whole.per_rank_lookup_s)


def test_criteo_kaggles_tiny_tables_stay_whole_on_128_ranks() -> None:
    pytest.importorskip("torchrec")
    tables = _criteo()
    plan = plan_tables(tables, 128)
    assert not any(p.replicated for p in plan.placements.values())
    # C10 and C26 can neither split over 128 ranks (cache sets) nor be replicated (> 1 MiB):
    # a rank serves the global batch of each. Every tiny table whole on a rank of its own
    # costs no more than that; replicas would add their cost to every rank, C26's too.
    for name in ("C10", "C26"):
        table = next(t for t in tables if t.name == name)
        assert "data_parallel" not in allowed_types(table, 128, 128)
        assert plan.placements[name].sharding_type == "table_wise"
    whole = shard_seconds(tables[25], 1, 128 * PLANNER_BATCH, KernelRates())
    assert max(plan.per_rank_lookup_s) < 1.1 * whole
    tiny = [t.name for t in tables if t.rows <= 3194]
    assert all(plan.placements[n].sharding_type == "table_wise" for n in tiny)
    assert len({plan.placements[n].ranks for n in tiny}) == len(tiny)
    everyone = {"sharding_type": "data_parallel", "ranks": list(range(128))}
    replicas = plan_tables(tables, 128, overrides=dict.fromkeys(tiny, everyone))
    assert max(replicas.per_rank_lookup_s) > max(plan.per_rank_lookup_s)
