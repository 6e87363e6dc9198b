"""``ssl-rec quantize``, ``ssl-rec explain`` and ``ssl-rec monitor``: low-precision serving.

Data comes from ``--data`` (a LightningDataModule, as for ``ssl-rec export``), else from the
data module recorded in the checkpoint by ``ssl-rec fit``. Options may be spelled with
dashes or underscores (``--budget-ne`` = ``--budget_ne``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytorch_lightning as pl
from jsonargparse import CLI

from ssl_rec._io import atomic_write_json
from ssl_rec.cli.datamodules import datamodule_from, split_loader
from ssl_rec.lightning import CTRModule
from ssl_rec.lightning.checkpoint import load_module, read_checkpoint
from ssl_rec.quantize import (
    Architecture,
    FloatCTR,
    InferenceCTRModel,
    ModelBuilder,
    Rows,
    compare_on_slice,
    format_comparison,
    format_explanation,
    load_quantized,
    quantize_ctr,
    read_report,
    save_quantized,
)
from ssl_rec.quantize import explain as explain_models
from ssl_rec.schema import FeatureSchema
from ssl_rec.types import Batch

log = logging.getLogger(__name__)
EXIT_PAST_BUDGET = 1
_OPTION = re.compile(r"^--([A-Za-z][\w-]*)")


def normalize_options(argv: Sequence[str]) -> list[str]:
    """``--budget-ne`` -> ``--budget_ne`` (the flags are Python parameter names)."""
    return [_OPTION.sub(lambda m: "--" + m.group(1).replace("-", "_"), a) for a in argv]


def load_ctr(ckpt: str) -> tuple[CTRModule, FloatCTR]:
    """The CTR module of checkpoint ``ckpt`` and its FP32 serving form.

    Raises:
        ValueError: the checkpoint holds another model, or does not describe its backbone.

    """
    module = load_module(ckpt)
    if not isinstance(module, CTRModule):
        raise ValueError(
            f"{ckpt}: not a CTR model ({type(module).__name__}); quantization "
            "needs a checkpoint of ssl_rec.lightning.CTRModule"
        )
    module.eval()
    hparams = read_checkpoint(ckpt).get("hyper_parameters", {})
    backbone = hparams.get("backbone")
    if not isinstance(backbone, Mapping) or "init_args" not in backbone:
        raise ValueError(
            f"{ckpt}: the checkpoint does not describe its backbone as a config "
            "(train it with `ssl-rec fit` to quantize it)"
        )
    encoder = dict(
        backbone["init_args"].get("encoder") or {"class_path": "ssl_rec.models.DLRMEncoder"}
    )
    architecture = Architecture(
        module.backbone.dims.embedding_dim, encoder, list(hparams.get("head_hidden") or [])
    )
    return module, FloatCTR.from_backbone(module.backbone, module.head, architecture)


def check_schema(model: FeatureSchema, data: FeatureSchema, where: str) -> None:
    """Raise ``ValueError`` naming the differences when ``data`` is not ``model``'s schema."""
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
    datamodule: pl.LightningDataModule,
    schema: FeatureSchema,
    split: str,
    max_rows: int,
    role: str,
) -> Rows:
    """The first ``max_rows`` labeled rows of ``split``, checked against the model's schema."""
    if max_rows < 1:
        raise ValueError(f"the number of {role} rows must be >= 1, got {max_rows}")
    where = f"the {role} data (split {split!r})"
    check_schema(schema, datamodule.schema, where)
    return Rows.from_batches(split_loader(datamodule, split), max_rows, where)


def quantize(
    ckpt: str,
    out: str,
    budget_ne: float = 0.001,
    data: pl.LightningDataModule | None = None,
    calibration_split: str = "val",
    evaluation_split: str = "test",
    calibration_rows: int = 65536,
    evaluation_rows: int = 100_000,
    tiny_rows: int = 128,
    explain: bool = False,
    overwrite: bool = False,
    min_pair_agreement: float | None = None,
    tiny_weights: int = 4096,
) -> dict[str, Any]:
    """Quantize a trained CTR model: the smallest model whose NE stays within the budget.

    Args:
        ckpt: CTR checkpoint written by ``ssl-rec fit``.
        out: directory for the quantized model (schema, model, ``report.json``).
        budget_ne: largest allowed NE change on the calibration rows (> 0).
        data: data module (default: the one recorded in the checkpoint).
        calibration_split: split the search measures NE on.
        evaluation_split: held-out split the report measures the result on.
        calibration_rows: rows of ``calibration_split`` used.
        evaluation_rows: rows of ``evaluation_split`` used.
        tiny_rows: tables with at most this many rows only go down to FP16.
        explain: also run the numeric debugger on the result (``report.json: explanation``).
        overwrite: replace an existing ``out``.
        min_pair_agreement: also keep the fraction of calibration row pairs ordered as by
            FP32 at or above this (e.g. 0.99; default: NE budget only).
        tiny_weights: Linear layers with at most this many weights stay FP32 (their INT8
            twin is slower: it quantizes each batch's activations first).

    """
    if not budget_ne > 0:
        raise ValueError(f"--budget-ne must be > 0 (an NE change such as 0.001), got {budget_ne}")
    module, source = load_ctr(ckpt)
    datamodule = datamodule_from(ckpt, data, module, use_labels=True)
    calibration = labeled_rows(
        datamodule, source.schema, calibration_split, calibration_rows, "calibration"
    )
    evaluation = labeled_rows(
        datamodule, source.schema, evaluation_split, evaluation_rows, "evaluation"
    )
    trained = {"trained_module": lambda dense, sparse: module(Batch(dense, sparse))}
    model, report = quantize_ctr(
        source, calibration, evaluation, budget_ne, tiny_rows, trained, min_pair_agreement,
        tiny_weights,
    )  # fmt: skip
    report["min_pair_agreement"] = min_pair_agreement
    report["splits"] = {"calibration": calibration_split, "evaluation": evaluation_split}
    if explain:
        fp32 = ModelBuilder(source).build(source.fp32_plan())
        report["explanation"] = explain_models(fp32, model, calibration)
        print(format_explanation(report["explanation"]))
    extra = {
        "source": {"checkpoint": str(ckpt)},
        "data": read_checkpoint(ckpt).get("datamodule_hyper_parameters"),
    }
    vocabularies = getattr(module, "vocabulary", None)
    save_quantized(model, out, report, extra, overwrite=overwrite, vocabularies=vocabularies)
    print(summarize(report, out))
    return report


def summarize(report: Mapping[str, Any], out: str) -> str:
    """Three lines: size and speed, NE and AUC before and after, the chosen precisions."""
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


def _reference_and_candidate(
    reference: str, candidate: str
) -> tuple[FloatCTR, InferenceCTRModel, InferenceCTRModel]:
    _, source = load_ctr(reference)
    model = load_quantized(candidate)
    check_schema(source.schema, model.schema, f"the quantized model {candidate}")
    return source, ModelBuilder(source).build(source.fp32_plan()), model


def explain_command(
    reference: str,
    candidate: str,
    data: pl.LightningDataModule | None = None,
    split: str = "val",
    rows: int = 16384,
    json_out: str | None = None,
) -> dict[str, Any]:
    """Compare a quantized model with its FP32 checkpoint layer by layer; name the culprit.

    Args:
        reference: the CTR checkpoint the model was quantized from.
        candidate: the quantized model directory.
        data: data module (default: the one recorded in the checkpoint).
        split: split whose rows are compared.
        rows: rows used (NE attribution on all of them, activations on the first 4096).
        json_out: also write the full comparison here as JSON.

    """
    source, fp32, model = _reference_and_candidate(reference, candidate)
    datamodule = datamodule_from(reference, data, fp32, use_labels=True)
    sample = labeled_rows(datamodule, source.schema, split, rows, "explain")
    result = explain_models(fp32, model, sample)
    print(format_explanation(result))
    if json_out:
        atomic_write_json(json_out, result)
    return result


def monitor(
    reference: str,
    candidate: str,
    data: pl.LightningDataModule | None = None,
    split: str = "test",
    budget_ne: float | None = None,
    rows: int = 100_000,
    json_out: str | None = None,
) -> dict[str, Any]:
    """Check that a quantized model still tracks its FP32 checkpoint on a new slice of data.

    Exits with status 1 when the NE change is past the budget (a scheduler's signal to
    quantize again), 0 otherwise.

    Args:
        reference: the CTR checkpoint the model was quantized from (or retrained since).
        candidate: the quantized model directory.
        data: data module of the new slice (default: the one recorded in the checkpoint).
        split: split of ``data`` to compare on.
        budget_ne: allowed NE change (default: the budget the model was quantized with).
        rows: rows of ``split`` used.
        json_out: also write the comparison here as JSON.

    """
    source, fp32, model = _reference_and_candidate(reference, candidate)
    report = read_report(candidate)
    budget = report.get("budget_ne", 0.001) if budget_ne is None else budget_ne
    if not budget > 0:
        raise ValueError(f"--budget-ne must be > 0 (an NE change such as 0.001), got {budget}")
    datamodule = datamodule_from(reference, data, fp32, use_labels=True)
    sample = labeled_rows(datamodule, source.schema, split, rows, "monitored")
    result = compare_on_slice(fp32, model, sample, budget, report.get("tables"))
    print(format_comparison(result))
    if json_out:
        atomic_write_json(json_out, result)
    if not result["passed"]:
        raise SystemExit(EXIT_PAST_BUDGET)
    return result


def _cli(function: Any, argv: Sequence[str]) -> Any:
    return CLI(function, args=normalize_options(argv), as_positional=False, exit_on_error=False)


def quantize_main(argv: Sequence[str]) -> dict[str, Any]:
    """Entry of ``ssl-rec quantize``; ``--help`` lists the flags."""
    return _cli(quantize, argv)


def explain_main(argv: Sequence[str]) -> dict[str, Any]:
    """Entry of ``ssl-rec explain``; ``--help`` lists the flags."""
    return _cli(explain_command, argv)


def monitor_main(argv: Sequence[str]) -> dict[str, Any]:
    """Entry of ``ssl-rec monitor``; ``--help`` lists the flags."""
    return _cli(monitor, argv)
