"""The accuracy monitor: does a quantized model still track its FP32 reference on new data?

On a new slice of labeled rows it compares NE, AUC, logloss and calibration of the two
models, and per table the drift of the lookups: the relative error of the rows the slice
looks up and the share of lookups that hit id 0 (missing, rare or unseen values), each next
to its value on the calibration rows. The slice passes when the NE change stays within the
budget (either direction, as in the search).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssl_rec._checks import check_positive
from ssl_rec.quantize.model import InferenceCTRModel
from ssl_rec.quantize.numerics import table_errors
from ssl_rec.quantize.ptq import agreement, json_safe
from ssl_rec.quantize.scoring import Rows, logits_of, summary

__all__ = ["compare_on_slice"]

_DRIFT_KEYS = ("lookup_relative_error", "missing_share")


def compare_on_slice(
    reference: InferenceCTRModel,
    candidate: InferenceCTRModel,
    rows: Rows,
    budget_ne: float,
    calibration_tables: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Compare the two models on ``rows``; ``passed`` is ``|NE change| <= budget_ne``.

    Args:
        reference: the FP32 model.
        candidate: the quantized model.
        rows: the new labeled slice.
        budget_ne: the allowed NE change (> 0).
        calibration_tables: the quantization report's ``tables`` entry, to show each
            table's drift next to its value on the calibration rows.

    Returns:
        ``{"passed", "budget_ne", "ne_change", "reference", "candidate", "agreement",
        "tables", "rows"}``.

    """
    budget = check_positive("monitor", "budget_ne", budget_ne)
    if reference.schema != candidate.schema:
        raise ValueError("the reference and candidate models have different feature schemas")
    ref_logits, cand_logits = logits_of(reference, rows), logits_of(candidate, rows)
    ref, cand = summary(ref_logits, rows.label), summary(cand_logits, rows.label)
    tables = table_errors(reference, candidate, rows.sparse)
    for name, now in tables.items():
        before = (calibration_tables or {}).get(name, {})
        now["precision"] = candidate.plan.tables[name]
        for key in _DRIFT_KEYS:
            if before.get(key) is not None:
                now[f"{key}_calibration"] = before[key]
    change = cand["ne"] - ref["ne"]
    return json_safe(
        {
            "passed": abs(change) <= budget,
            "budget_ne": budget,
            "ne_change": change,
            "reference": ref,
            "candidate": cand,
            "rows": len(rows),
            "agreement": agreement(ref_logits, cand_logits),
            "tables": tables,
        }
    )


def format_comparison(result: Mapping[str, Any], top: int = 5) -> str:
    """A short text summary: verdict, metrics side by side, the most drifted tables."""
    ref, cand = result["reference"], result["candidate"]
    verdict = "within" if result["passed"] else "PAST"
    lines = [
        f"NE change {result['ne_change']:+.2e} {verdict} the budget {result['budget_ne']:g} "
        f"on {result['rows']} rows"
    ]
    for key in ("ne", "auc", "logloss", "calibration"):
        lines.append(f"  {key:<12} reference {ref[key]:.6f}  quantized {cand[key]:.6f}")
    drift = sorted(
        result["tables"].items(), key=lambda kv: -(kv[1]["lookup_relative_error"] or 0.0)
    )
    for name, t in drift[:top]:
        before = t.get("lookup_relative_error_calibration")
        was = "" if before is None else f" (calibration {before:.4f})"
        lines.append(
            f"  table {name:<8} {t['precision']:<5} lookup rel. error "
            f"{t['lookup_relative_error']:.4f}{was}, id 0 share {t['missing_share']:.3f}"
        )
    return "\n".join(lines)
