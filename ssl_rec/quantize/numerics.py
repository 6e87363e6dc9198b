"""Numeric comparisons of an FP32 model and a quantized one: SQNR, table and layer errors."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ssl_rec.quantize.dense import dense_layers
from ssl_rec.quantize.model import InferenceCTRModel

__all__ = ["capture", "layer_sqnr", "relative_error", "sqnr_db", "table_errors"]


def sqnr_db(reference: torch.Tensor, test: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB, ``10 log10(|ref|^2 / |ref - test|^2)``.

    ``inf`` when the tensors are equal.
    """
    ref = reference.double()
    noise = float((ref - test.double()).pow(2).sum())
    signal = float(ref.pow(2).sum())
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(max(signal, 1e-300) / noise)


def relative_error(reference: torch.Tensor, test: torch.Tensor) -> float:
    """``|ref - test| / |ref|`` (Frobenius norms; 0 when both are zero)."""
    ref = reference.double()
    norm = float(ref.norm())
    diff = float((ref - test.double()).norm())
    return diff / norm if norm > 0 else diff


@torch.inference_mode()
def capture(
    model: InferenceCTRModel, dense: torch.Tensor, sparse: torch.Tensor
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{layer name: (input, output)}`` of every dense layer, and ``"logits"``, on one batch."""
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    hooks = [
        layer.register_forward_hook(
            lambda _m, args, out, name=name: seen.__setitem__(name, (args[0], out))
        )
        for name, layer in dense_layers(model.dense)
    ]
    try:
        logits = model(dense, sparse)
    finally:
        for hook in hooks:
            hook.remove()
    seen["logits"] = (dense, logits)
    return seen


@torch.inference_mode()
def layer_sqnr(
    reference: InferenceCTRModel,
    candidate: InferenceCTRModel,
    dense: torch.Tensor,
    sparse: torch.Tensor,
) -> dict[str, dict[str, float]]:
    """Per dense layer: ``local_sqnr_db`` and ``sqnr_db``, on one batch.

    ``local``: the candidate's layer fed the reference's input to that layer (its own
    error); plain: the candidate's activations against the reference's (the error
    accumulated up to that layer).
    """
    ref, cand = capture(reference, dense, sparse), capture(candidate, dense, sparse)
    out = {}
    for name, _ in dense_layers(candidate.dense):
        ref_in, ref_out = ref[name]
        local = candidate.layer(name)(ref_in)
        out[name] = {
            "local_sqnr_db": sqnr_db(ref_out, local),
            "sqnr_db": sqnr_db(ref_out, cand[name][1]),
        }
    out["logits"] = {"sqnr_db": sqnr_db(ref["logits"][1], cand["logits"][1])}
    return out


@torch.inference_mode()
def table_errors(
    reference: InferenceCTRModel, candidate: InferenceCTRModel, sparse: torch.Tensor
) -> dict[str, dict[str, float]]:
    """Per table: relative error of all rows and of the rows ``sparse int64[N, F]`` looks up.

    Also the share of lookups of id 0 (missing, rare or unseen values), a sign of drift.
    """
    fields: Sequence[str] = reference.schema.field_names
    out = {}
    for f, name in enumerate(fields):
        rows = torch.arange(reference.tables.cardinalities[f])
        ids = sparse[:, f]
        ref_rows, cand_rows = reference.tables.rows(f, rows), candidate.tables.rows(f, rows)
        out[name] = {
            "rows_relative_error": relative_error(ref_rows, cand_rows),
            "lookup_relative_error": relative_error(ref_rows[ids], cand_rows[ids]),
            "missing_share": float((ids == 0).double().mean()),
        }
    return out
