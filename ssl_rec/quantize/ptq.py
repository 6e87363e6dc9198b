"""Post-training quantization of a trained CTR model under an NE budget, and its report."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ssl_rec.quantize.model import FloatCTR, InferenceCTRModel, ModelBuilder
from ssl_rec.quantize.numerics import layer_sqnr, table_errors
from ssl_rec.quantize.scoring import Model, Rows, logits_of, pair_agreement, summary, throughput
from ssl_rec.quantize.search import SearchResult, search_plan

__all__ = ["REPORT_FORMAT", "SPEED_BATCH", "build_report", "quantize_ctr"]

REPORT_FORMAT = 1
SPEED_BATCH = 4096
_METRICS = ("ne", "auc", "logloss", "calibration")


def quantize_ctr(
    source: FloatCTR,
    calibration: Rows,
    evaluation: Rows,
    budget_ne: float,
    tiny_rows: int = 128,
    speed_models: Mapping[str, Model] | None = None,
    min_pair_agreement: float | None = None,
    tiny_weights: int = 4096,
) -> tuple[InferenceCTRModel, dict[str, Any]]:
    """Search the smallest plan within ``budget_ne`` on ``calibration``; report on ``evaluation``.

    Args:
        source: the trained model in FP32.
        calibration: labeled rows the search measures NE on.
        evaluation: held-out labeled rows the report measures the result on.
        budget_ne: largest allowed NE change on ``calibration`` (> 0).
        tiny_rows: tables with at most this many rows only go down to FP16.
        speed_models: other models to time beside FP32 and the result (e.g. the trained
            module's own forward), ``name -> model(dense, sparse)``.
        min_pair_agreement: also keep the pair order of FP32 on ``calibration`` at or above
            this fraction (see :func:`~ssl_rec.quantize.search.search_plan`).
        tiny_weights: Linear layers with at most this many weights stay FP32.

    Returns:
        The quantized model and its report (see :func:`build_report`).

    """
    builder = ModelBuilder(source)
    result = search_plan(
        builder, calibration, budget_ne, tiny_rows, min_pair_agreement, tiny_weights
    )
    fp32, quantized = builder.build(source.fp32_plan()), builder.build(result.plan)
    report = build_report(fp32, quantized, result, calibration, evaluation, budget_ne, speed_models)
    return quantized, report


def build_report(
    fp32: InferenceCTRModel,
    quantized: InferenceCTRModel,
    search: SearchResult | None,
    calibration: Rows,
    evaluation: Rows,
    budget_ne: float,
    speed_models: Mapping[str, Model] | None = None,
) -> dict[str, Any]:
    """Everything known about a quantized model against its FP32 original (JSON-able).

    Top-level metrics (``ne_*``, ``auc_*``, ``logloss_*``, ``calibration_*``) are on the
    held-out ``evaluation`` rows, ``calibration_set`` has the same on the calibration rows;
    ``samples_per_s_*`` are at batch 4096 on one thread; ``choices`` is the plan.
    """
    logits = {"fp32": logits_of(fp32, evaluation), "quantized": logits_of(quantized, evaluation)}
    held_out = {k: summary(v, evaluation.label) for k, v in logits.items()}
    on_calibration = {
        k: summary(logits_of(m, calibration), calibration.label)
        for k, m in (("fp32", fp32), ("quantized", quantized))
    }
    speed = throughput(
        {"fp32": fp32, "quantized": quantized, **(speed_models or {})},
        evaluation,
        SPEED_BATCH,
        threads=1,
    )
    report: dict[str, Any] = {
        "format": REPORT_FORMAT,
        "budget_ne": budget_ne,
        "rows": {"calibration": len(calibration), "evaluation": len(evaluation)},
    }
    report |= _side_by_side(held_out)
    report["ne_change"] = held_out["quantized"]["ne"] - held_out["fp32"]["ne"]
    report["calibration_set"] = _side_by_side(on_calibration)
    report |= _sizes(fp32, quantized)
    report |= {f"samples_per_s_{k}": v["samples_per_s"] for k, v in speed.items()}
    report["speedup"] = speed["quantized"]["samples_per_s"] / speed["fp32"]["samples_per_s"]
    report["speedup_cpu_time"] = (
        speed["quantized"]["samples_per_cpu_s"] / speed["fp32"]["samples_per_cpu_s"]
    )
    report["speed"] = {"batch": SPEED_BATCH, "threads": 1, **speed}
    report["choices"] = quantized.plan.to_dict()
    report["agreement"] = agreement(logits["fp32"], logits["quantized"])
    report |= _unit_errors(fp32, quantized, calibration)
    if search is not None:
        report["search"] = search.to_dict()
    return json_safe(report)


def agreement(reference: torch.Tensor, candidate: torch.Tensor) -> dict[str, float]:
    """How alike two models' predictions are: pair order and probability changes."""
    change = (torch.sigmoid(candidate.double()) - torch.sigmoid(reference.double())).abs()
    return {
        "pairs_same_order": pair_agreement(reference, candidate),
        "max_probability_change": float(change.max()),
        "mean_probability_change": float(change.mean()),
    }


def _side_by_side(metrics: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    return {f"{m}_{model}": float(values[m]) for model, values in metrics.items() for m in _METRICS}


def _sizes(fp32: InferenceCTRModel, quantized: InferenceCTRModel) -> dict[str, Any]:
    before, after = fp32.nbytes(), quantized.nbytes()
    return {
        "bytes_fp32": before["total"],
        "bytes_quantized": after["total"],
        "compression": before["total"] / after["total"],
        "bytes": {"fp32": before, "quantized": after},
    }


def _unit_errors(
    fp32: InferenceCTRModel, quantized: InferenceCTRModel, calibration: Rows
) -> dict[str, Any]:
    """Per-table embedding error (on the calibration lookups) and per-layer SQNR."""
    dense, sparse = calibration.batch(0, min(len(calibration), SPEED_BATCH))
    tables = table_errors(fp32, quantized, calibration.sparse)
    dims = fp32.tables.table_bytes(), quantized.tables.table_bytes()
    for f, name in enumerate(fp32.schema.field_names):
        tables[name] |= {
            "precision": quantized.plan.tables[name],
            "bytes_fp32": dims[0][f],
            "bytes": dims[1][f],
            "rows": fp32.tables.cardinalities[f],
        }
    layers = layer_sqnr(fp32, quantized, dense, sparse)
    for name, precision in quantized.plan.layers.items():
        layers[name]["precision"] = precision
    return {"tables": tables, "layers": layers}


def json_safe(value: Any) -> Any:
    """``value`` with non-finite floats as ``None`` and numpy/torch scalars as floats."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, bool | int | str) or value is None:
        return value
    value = float(value)
    return value if math.isfinite(value) else None
