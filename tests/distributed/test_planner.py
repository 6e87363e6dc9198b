"""Planner, plans and cost model (one process; TorchRec's planner for ``auto``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ssl_rec.data import CRITEO_KAGGLE_CARDINALITIES
from ssl_rec.distributed import TablePlacement, check_plan, plan_from_dict
from ssl_rec.distributed.cost_model import TableInfo, default_hit_rate, step_cost
from ssl_rec.distributed.cyclic_layout import check_row_split
from ssl_rec.distributed.planner import plan_tables
from ssl_rec.hardware import TableSpec

INT8 = TableSpec("int8", 0.05)


def criteo(spec: TableSpec = INT8, dim: int = 16) -> list[TableInfo]:
    return [TableInfo(f"C{i + 1}", rows, dim, spec, default_hit_rate(spec))
            for i, rows in enumerate(CRITEO_KAGGLE_CARDINALITIES)]  # fmt: skip


def test_auto_plan_of_criteo_kaggle_on_8_ranks_is_balanced_and_deterministic() -> None:
    pytest.importorskip("torchrec")
    tables = criteo()
    first, second = plan_tables(tables, 8), plan_tables(tables, 8)
    assert first.to_dict() == second.to_dict()
    assert first.imbalance <= 0.10
    biggest = max(tables, key=lambda t: t.rows)
    assert first.placements[biggest.name].num_shards == 8  # 10M rows cannot stay whole
    for t in tables:  # every split is exact (a replica is whole on every rank)
        if first.placements[t.name].row_splits > 1:
            check_row_split(t.name, t.rows, t.spec, first.placements[t.name].row_splits)


def test_fixed_plans_and_overrides() -> None:
    tables = criteo()
    table_wise = plan_tables(tables, 8, sharding="table_wise")
    assert all(p.sharding_type == "table_wise" for p in table_wise.placements.values())
    assert table_wise.imbalance > 0.5  # a 10M-row table on one of 8 ranks
    by_hand = {"C3": {"sharding_type": "table_wise", "ranks": [5]}}
    row_wise = plan_tables(tables, 8, sharding="row_wise", overrides=by_hand)
    assert row_wise.placements["C3"] == TablePlacement("table_wise", (5,))
    assert row_wise.placements["C4"].num_shards == 8
    with pytest.raises(ValueError, match="cache sets do not divide"):
        bad = {"C1": {"sharding_type": "row_wise", "ranks": list(range(8))}}
        plan_tables(tables, 8, overrides=bad, sharding="table_wise")


def test_plan_checks_name_what_is_wrong() -> None:
    names, rows, specs = ["a", "b"], [100, 50], [TableSpec(), TableSpec()]
    with pytest.raises(ValueError, match="missing tables \\['b'\\]"):
        check_plan(plan_from_dict({"a": {"sharding_type": "table_wise", "ranks": [0]}}), names,
                   rows, specs, 2)  # fmt: skip
    with pytest.raises(ValueError, match="outside \\[0, 2\\)"):
        plan = {"a": TablePlacement("table_wise", (3,)), "b": TablePlacement("table_wise", (0,))}
        check_plan(plan, names, rows, specs, 2)
    with pytest.raises(ValueError, match="one rank"):
        TablePlacement("table_wise", (0, 1))
    with pytest.raises(ValueError, match="expected"):
        plan_from_dict({"a": "row_wise"})


def test_cost_model_splits_memory_and_traffic_with_the_ranks() -> None:
    tables = criteo()
    costs = {}
    for world in (8, 32, 128):
        plan = plan_tables(tables, world, sharding="row_wise").placements
        costs[world] = step_cost(tables, plan, world, batch_per_rank=512, dense_param_bytes=2**20)
    assert max(costs[128]["per_rank_bytes"]) < max(costs[8]["per_rank_bytes"]) / 8
    # A rank sends its own samples' rows whatever W; only the ids' lengths (one per sample
    # and shard key) grow with W, so the traffic grows far slower than the ranks.
    assert costs[128]["a2a_bytes_per_rank"] < 4 * costs[8]["a2a_bytes_per_rank"]
    assert costs[128]["step_s"] > costs[128]["parts"]["dense_s"] > 0


def test_plan_command_prints_and_writes_the_plan(tmp_path: Path) -> None:
    pytest.importorskip("torchrec")
    from ssl_rec.cli import run as cli_run

    out = tmp_path / "plan.json"
    config = Path(__file__).resolve().parents[2] / "configs/dist/synthetic_int8_row_wise.yaml"
    result = cli_run(["plan", "--config", str(config), "--world_size", "8", "--cardinalities",
                      "criteo_kaggle", "--out", str(out), f"--data.init_args.cache_dir={tmp_path}",
                      "--data.init_args.n_train=256", "--data.init_args.n_val=64",
                      "--data.init_args.n_test=64"])  # fmt: skip
    written = json.loads(out.read_text())
    assert len(written["per_rank_bytes"]) == 8 and written["imbalance"] == result.imbalance
    assert written["imbalance"] <= 0.10
    assert set(written["plan"]) == {f"C{i}" for i in range(1, 27)}
