"""Post-training quantization end to end: checked rows in, a quantized model directory out.

What ``ssl-rec quantize``, ``explain``, ``monitor`` and ``predict`` share once a command has
loaded its checkpoint and data: the rows are checked against the model's schema
(:func:`check_schema`, :func:`labeled_rows`); :func:`quantize_to_directory` runs the
NE-budget search (:func:`~ssl_rec.quantize.ptq.quantize_ctr`), optionally the numeric
debugger, and writes the directory; :func:`format_summary` is the three lines a command
prints. Nothing here reads a Lightning checkpoint
(:func:`ssl_rec.lightning.ctr_checkpoint.load_ctr` does).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ssl_rec.quantize.explain import explain
from ssl_rec.quantize.model import FloatCTR, ModelBuilder
from ssl_rec.quantize.ptq import quantize_ctr
from ssl_rec.quantize.quantized_directory import save_quantized
from ssl_rec.quantize.scoring import Model, Rows
from ssl_rec.schema import FeatureSchema
from ssl_rec.types import Batch
from ssl_rec.vocab import Vocabularies

__all__ = ["check_schema", "format_summary", "labeled_rows", "quantize_to_directory"]


def check_schema(model: FeatureSchema, data: FeatureSchema, where: str) -> None:
    """Raise ``ValueError`` naming the differences when ``data`` is not ``model``'s schema.

    Args:
        model: the schema the model was trained on.
        data: the schema of the data (or of another model) it is given.
        where: what ``data`` is, for the message (``"the prediction data"``).

    """
    if model == data:
        return
    mine = dict(zip(model.field_names, model.cardinalities, strict=True))
    theirs = dict(zip(data.field_names, data.cardinalities, strict=True))
    fields = sorted(n for n in {*mine, *theirs} if mine.get(n) != theirs.get(n))
    dense = [] if model.dense == data.dense else [list(model.dense), list(data.dense)]
    raise ValueError(
        f"{where} has another schema than the model: fields {fields[:6]} "
        f"(model {[mine.get(n) for n in fields[:6]]} ids, data "
        f"{[theirs.get(n) for n in fields[:6]]})"
        + (f", dense columns {dense[1]} vs {dense[0]}" if dense else "")
    )


def labeled_rows(
    batches: Iterable[Batch],
    schema: FeatureSchema,
    data_schema: FeatureSchema,
    max_rows: int,
    role: str,
    split: str,
) -> Rows:
    """The first ``max_rows`` labeled rows of ``batches``, their schema checked against the model's.

    Args:
        batches: a split's batches (e.g. a data module's ``val_dataloader()``).
        schema: the model's schema.
        data_schema: the schema of the data ``batches`` come from.
        max_rows: rows kept (>= 1).
        role: what the rows are for (``calibration``, ``evaluation``), for messages.
        split: the split they come from, for messages.

    Raises:
        ValueError: ``max_rows < 1``, another schema, no rows or no labels.

    """
    if max_rows < 1:
        raise ValueError(f"the number of {role} rows must be >= 1, got {max_rows}")
    where = f"the {role} data (split {split!r})"
    check_schema(schema, data_schema, where)
    return Rows.from_batches(batches, max_rows, where)


def quantize_to_directory(
    source: FloatCTR,
    calibration: Rows,
    evaluation: Rows,
    out: str | Path,
    budget_ne: float,
    *,
    tiny_rows: int = 128,
    tiny_weights: int = 4096,
    min_pair_agreement: float | None = None,
    speed_models: Mapping[str, Model] | None = None,
    splits: Mapping[str, str] | None = None,
    explain_result: bool = False,
    extra: Mapping[str, Any] | None = None,
    vocabularies: Vocabularies | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Quantize ``source`` within ``budget_ne`` and write the model directory ``out``.

    Args:
        source: the trained model in FP32.
        calibration: labeled rows the search measures NE on.
        evaluation: held-out labeled rows the report measures the result on.
        out: the directory to create (schema, model, ``report.json``).
        budget_ne: largest allowed NE change on ``calibration`` (> 0).
        tiny_rows: tables with at most this many rows only go down to FP16.
        tiny_weights: Linear layers with at most this many weights stay FP32.
        min_pair_agreement: also keep this fraction of calibration row pairs ordered as by
            FP32 (``None``: the NE budget only).
        speed_models: other models timed beside FP32 and the result, ``name -> model``.
        splits: the splits the rows came from, recorded in the report.
        explain_result: also run the numeric debugger (``report["explanation"]``).
        extra: more manifest entries (``source`` checkpoint, ``data`` module record).
        vocabularies: the trained model's vocabularies, kept with the model.
        overwrite: replace an existing ``out``.

    Returns:
        The report written as ``report.json``.

    """
    model, report = quantize_ctr(
        source, calibration, evaluation, budget_ne, tiny_rows, speed_models, min_pair_agreement,
        tiny_weights,
    )  # fmt: skip
    report["min_pair_agreement"] = min_pair_agreement
    if splits is not None:
        report["splits"] = dict(splits)
    if explain_result:
        fp32 = ModelBuilder(source).build(source.fp32_plan())
        report["explanation"] = explain(fp32, model, calibration)
    save_quantized(model, out, report, extra, overwrite=overwrite, vocabularies=vocabularies)
    return report


def format_summary(report: Mapping[str, Any], out: str | Path) -> str:
    """Three lines: size and speed, NE and AUC before and after, the chosen precisions.

    Args:
        report: a report of :func:`quantize_to_directory`.
        out: the directory it was written to.

    """
    counts: dict[str, int] = {}
    for precision in [*report["choices"]["tables"].values(), *report["choices"]["layers"].values()]:
        counts[precision] = counts.get(precision, 0) + 1
    return (
        f"quantized model written to {out}: {report['compression']:.2f}x smaller, "
        f"{report['speedup']:.2f}x the samples/s of FP32 (batch 4096, one thread)\n"
        f"NE {report['ne_fp32']:.5f} -> {report['ne_quantized']:.5f} "
        f"(budget {report['budget_ne']:g}), AUC {report['auc_fp32']:.4f} -> "
        f"{report['auc_quantized']:.4f}\nprecisions: "
        + ", ".join(f"{n} x {p}" for p, n in sorted(counts.items()))
    )
