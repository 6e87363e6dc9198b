"""The numeric debugger: which table or layer spends a quantized model's NE budget.

Two views of the same question, on one set of rows:

- *activations*: each dense layer's output in the quantized model against the FP32 model's
  (SQNR of the layer alone, fed FP32 inputs, and of the activations as they arrive), and
  each table's lookups against FP32's;
- *attribution*: for every table and layer, the NE change of the quantized model minus
  that of the same model with only this unit put back to FP32: the NE the unit spends.

The unit that spends the most NE is named; the activations show where its error enters.
"""

from __future__ import annotations

from typing import Any

from ssl_rec.quantize.model import InferenceCTRModel
from ssl_rec.quantize.numerics import layer_sqnr, table_errors
from ssl_rec.quantize.ptq import json_safe
from ssl_rec.quantize.scoring import Rows, logits_of, ne_of

__all__ = ["explain"]


def explain(
    reference: InferenceCTRModel, candidate: InferenceCTRModel, rows: Rows
) -> dict[str, Any]:
    """Compare ``candidate`` with its FP32 ``reference`` layer by layer and name the culprit.

    Args:
        reference: the FP32 model (built from the checkpoint).
        candidate: the quantized model (with any changes made to it since).
        rows: labeled rows; the activations are compared on the first 4096.

    Returns:
        ``{"culprit", "ne_reference", "ne_candidate", "ne_change", "units", "layers",
        "tables"}``; ``units`` lists every table and layer, the largest NE spender first.

    """
    if reference.schema != candidate.schema:
        raise ValueError("the reference and candidate models have different feature schemas")
    ne_ref = ne_of(logits_of(reference, rows), rows.label)
    ne_cand = ne_of(logits_of(candidate, rows), rows.label)
    units = []
    for unit in candidate.plan.units():
        restored = candidate.with_unit_from(reference, unit)
        spent = ne_cand - ne_of(logits_of(restored, rows), rows.label)
        units.append(
            {"unit": str(unit), "precision": candidate.plan.precision(unit), "ne_spent": spent}
        )
    units.sort(key=lambda u: -u["ne_spent"])
    dense, sparse = rows.batch(0, min(len(rows), 4096))
    return json_safe(
        {
            "culprit": units[0]["unit"] if units else None,
            "ne_reference": ne_ref,
            "ne_candidate": ne_cand,
            "ne_change": ne_cand - ne_ref,
            "units": units,
            "layers": layer_sqnr(reference, candidate, dense, sparse),
            "tables": table_errors(reference, candidate, rows.sparse),
        }
    )


def format_explanation(result: dict[str, Any], top: int = 8) -> str:
    """A short text summary: NE change, the culprit, the top spenders with their SQNR."""
    lines = [
        f"NE {result['ne_reference']:.6f} -> {result['ne_candidate']:.6f} "
        f"(change {result['ne_change']:+.2e}); spent most by: {result['culprit']}"
    ]
    for u in result["units"][:top]:
        kind, _, name = u["unit"].partition(" ")
        detail = (
            result["layers"].get(name, {}).get("local_sqnr_db")
            if kind == "layer"
            else result["tables"].get(name, {}).get("lookup_relative_error")
        )
        label = "local SQNR dB" if kind == "layer" else "lookup rel. error"
        shown = "exact" if detail is None else f"{detail:.4g}"
        lines.append(
            f"  {u['unit']:<28} {u['precision']:<17} NE spent {u['ne_spent']:+.2e}  {label} {shown}"
        )
    return "\n".join(lines)
