import copy

import pytest
import torch

from ssl_rec.hardware import serving_kernels
from ssl_rec.quantize import (
    ModelBuilder,
    QuantizationPlan,
    Rows,
    Unit,
    compare_on_slice,
    explain,
    load_quantized,
    logits_of,
    pair_agreement,
    quantize_ctr,
    save_quantized,
    search_plan,
)
from ssl_rec.quantize.quantization_plan import TABLE_LADDER
from ssl_rec.quantize.tables import QuantizedTables


@pytest.mark.parametrize("precisions", [["fp32"] * 3, ["int8", "int4", "int2"],
                                        ["fp16", "int2", "int8"]])  # fmt: skip
def test_tables_match_dequantized_rows(precisions):
    weights = [torch.randn(c, 8) for c in (5, 70, 9)]
    tables = QuantizedTables.from_float(weights, precisions)
    ids = torch.tensor([[0, 69, 8], [4, 3, 1]])
    expected = torch.stack([tables.rows(f, ids[:, f]) for f in range(3)], 1)
    torch.testing.assert_close(tables(ids), expected, rtol=0, atol=1e-6)
    if precisions[0] == "fp32":
        torch.testing.assert_close(tables(ids)[:, 0], weights[0][ids[:, 0]])


def test_tables_refuse_out_of_range_ids():
    tables = QuantizedTables.from_float([torch.randn(5, 8)], ["int4"])
    with pytest.raises(IndexError, match="id 5 outside 0..4"):
        tables(torch.tensor([[5]]))
    mixed = QuantizedTables.from_float([torch.randn(5, 8), torch.randn(3, 8)], ["int8", "fp16"])
    with pytest.raises(IndexError, match="row 1, table 1: id -1 outside 0..2"):
        mixed(torch.tensor([[4, 2], [0, -1]]))
    assert mixed(torch.zeros(0, 2, dtype=torch.int64)).shape == (0, 2, 8)


def test_fp32_plan_reproduces_the_trained_model(source, rows):
    model = ModelBuilder(source).build(source.fp32_plan())
    field_emb = torch.stack([source.weights[f][rows.sparse[:, f]] for f in range(4)], 1)
    with torch.no_grad():
        expected = source.dense(field_emb, rows.dense)
    torch.testing.assert_close(logits_of(model, rows), expected)


def test_tiny_budget_keeps_everything_fp32(source, rows):
    result = search_plan(ModelBuilder(source), rows, 1e-12, tiny_rows=3, tiny_weights=0)
    assert set(result.plan.tables.values()) == {"fp32"}
    assert set(result.plan.layers.values()) == {"fp32"}
    assert result.steps and not any(s.accepted for s in result.steps)


def test_generous_budget_picks_the_lowest_precisions(source, rows):
    result = search_plan(ModelBuilder(source), rows, 10.0, tiny_rows=3, tiny_weights=0)
    assert result.plan.tables == {"C0": "fp16", "C1": "int2", "C2": "int2", "C3": "int2"}
    # bf16 products only where they beat torch.bmm; the compiled FP32 kernel is faster
    expected = "fp32" if serving_kernels() is not None else "bf16"
    assert result.plan.layers["encoder.interaction"] == expected
    others = {k: v for k, v in result.plan.layers.items() if k != "encoder.interaction"}
    assert set(others.values()) == {"int8_fbgemm"}  # the first 1-byte choice of the ladder
    # every rung of a big table was taken in order, each step measured and kept
    c3 = [s.precision for s in result.steps if s.unit == "table C3"]
    assert c3 == [r[0] for r in TABLE_LADDER]


def test_budget_bounds_the_ne_change_and_int2_only_where_it_fits(source, rows):
    lowest = search_plan(ModelBuilder(source), rows, 10.0, tiny_rows=3, tiny_weights=0)
    budget = abs(lowest.ne - lowest.ne_fp32) / 4  # a quarter of what the lowest precisions cost
    assert budget > 0
    result = search_plan(ModelBuilder(source), rows, budget, tiny_rows=3, tiny_weights=0)
    assert abs(result.ne - result.ne_fp32) <= budget
    kept = [s for s in result.steps if s.accepted]
    assert all(abs(s.delta_ne) <= budget for s in kept)
    undone = [s for s in result.steps if not s.accepted]
    assert undone, "a budget below the lowest precisions' cost must refuse some moves"
    assert result.plan != lowest.plan
    for step in undone:  # a refused move either measured past the budget or was too sensitive
        assert (step.delta_ne is None and abs(step.sensitivity) > budget) or (
            abs(step.delta_ne) > budget
        )


def test_report_save_and_load(source, rows, tmp_path):
    model, report = quantize_ctr(source, rows, rows, 1e-3, tiny_rows=3, tiny_weights=0)
    for key in (
        "ne_fp32",
        "ne_quantized",
        "auc_fp32",
        "auc_quantized",
        "bytes_fp32",
        "bytes_quantized",
        "samples_per_s_fp32",
        "samples_per_s_quantized",
        "choices",
    ):
        assert key in report
    assert report["bytes_quantized"] < report["bytes_fp32"]
    assert report["speedup_cpu_time"] > 0
    assert report["speed"]["quantized"]["samples_per_cpu_s"] > 0
    assert set(report["tables"]) == {"C0", "C1", "C2", "C3"}
    assert "local_sqnr_db" in report["layers"]["encoder.top.0"]
    assert 0.5 < report["agreement"]["pairs_same_order"] <= 1.0
    save_quantized(model, tmp_path / "q", report)
    loaded = load_quantized(tmp_path / "q")
    torch.testing.assert_close(logits_of(loaded, rows), logits_of(model, rows), rtol=0, atol=0)
    with pytest.raises(FileExistsError):
        save_quantized(model, tmp_path / "q", report)


def test_pair_order_floor_undoes_moves_that_reorder_pairs(source, rows):
    free = search_plan(ModelBuilder(source), rows, 10.0, tiny_rows=3, tiny_weights=0)
    floor = 0.995
    held = search_plan(
        ModelBuilder(source), rows, 10.0, tiny_rows=3, min_pair_agreement=floor, tiny_weights=0
    )
    measured = [s for s in held.steps if s.pairs_same_order is not None]
    assert measured and all(s.accepted == (s.pairs_same_order >= floor) for s in measured)
    assert any(not s.accepted for s in measured)  # the floor binds where the budget did not
    assert held.plan != free.plan
    builder = ModelBuilder(source)
    fp32 = logits_of(builder.build(source.fp32_plan()), rows)
    assert pair_agreement(fp32, logits_of(builder.build(held.plan), rows)) >= floor
    with pytest.raises(ValueError, match="min_pair_agreement must be in"):
        search_plan(ModelBuilder(source), rows, 1e-3, min_pair_agreement=1.5)


def test_search_rejects_a_nonpositive_budget(source, rows):
    with pytest.raises(ValueError, match="budget_ne must be > 0"):
        search_plan(ModelBuilder(source), rows, 0.0)


def test_rows_from_an_empty_split_is_an_error():
    with pytest.raises(ValueError, match="no rows"):
        Rows.from_batches([], 100, "calibration split 'val'")


def _int8_plan(source):
    plan = source.fp32_plan()
    return QuantizationPlan(dict.fromkeys(plan.tables, "int8"),
                            dict.fromkeys(plan.layers, "bf16"))  # fmt: skip


def test_debugger_names_a_deliberately_broken_layer(source, rows):
    builder = ModelBuilder(source)
    fp32, candidate = builder.build(source.fp32_plan()), builder.build(_int8_plan(source))
    broken = candidate.with_unit_from(candidate, Unit("layer", "encoder.top.2"))
    layer = copy.deepcopy(broken.layer("encoder.top.2"))
    with torch.no_grad():
        layer.layer.weight.mul_(1.5)
    broken.dense.set_submodule("encoder.top.2", layer)
    result = explain(fp32, broken, rows)
    assert result["culprit"] == "layer encoder.top.2"
    worst = min((v["local_sqnr_db"], k) for k, v in result["layers"].items() if k != "logits")
    assert worst[1] == "encoder.top.2"


def test_monitor_flags_a_shifted_slice_and_passes_an_unshifted_one(source, fresh_rows):
    builder = ModelBuilder(source)
    fp32, candidate = builder.build(source.fp32_plan()), builder.build(_int8_plan(source))
    fresh = fresh_rows(source, 4096, 7)
    assert compare_on_slice(fp32, candidate, fresh, 1e-3)["passed"]
    shifted = Rows(fresh.dense * 1000, fresh.sparse, fresh.label)
    result = compare_on_slice(fp32, candidate, shifted, 1e-3)
    assert not result["passed"] and abs(result["ne_change"]) > 1e-3


def test_tiny_layers_stay_fp32(source, rows):
    # top.0 holds 18 x 32 = 576 weights; top.2 512, the bottom's 32 and 128, the head's 16
    result = search_plan(ModelBuilder(source), rows, 10.0, tiny_rows=3, tiny_weights=512)
    linear = {k: v for k, v in result.plan.layers.items() if k != "encoder.interaction"}
    assert linear.pop("encoder.top.0") == "int8_fbgemm"
    assert set(linear.values()) == {"fp32"}
    assert not any(s.unit.removeprefix("layer ") in linear for s in result.steps)
