"""``ssl-rec quantize``, ``ssl-rec explain`` and ``ssl-rec monitor``: low-precision serving.

Thin shells over :mod:`ssl_rec.quantize.workflow`: each loads the checkpoint
(:func:`~ssl_rec.lightning.ctr_checkpoint.load_ctr`) and the data, hands them on and prints
the result. Data comes from ``--data`` (a LightningDataModule, as for ``ssl-rec export``),
else from the data module recorded in the checkpoint by ``ssl-rec fit``. The checkpoint is
``--ckpt_path`` as for every subcommand (the old ``--ckpt`` / ``--reference`` and dashed
spellings such as ``--budget-ne`` still work, with a notice: :mod:`ssl_rec.cli.flag_vocabulary`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytorch_lightning as pl
from jsonargparse import CLI

from ssl_rec._io import atomic_write_json
from ssl_rec.cli.allow_class_option import ALLOW_HELP
from ssl_rec.cli.datamodules import datamodule_from, split_loader
from ssl_rec.cli.run_dir import refuse_existing_output
from ssl_rec.lightning.checkpoint_loading import read_checkpoint
from ssl_rec.lightning.ctr_checkpoint import load_ctr
from ssl_rec.quantize import (
    FloatCTR,
    InferenceCTRModel,
    ModelBuilder,
    Rows,
    check_schema,
    compare_on_slice,
    format_comparison,
    format_explanation,
    format_summary,
    labeled_rows,
    load_quantized,
    quantize_to_directory,
    read_report,
)
from ssl_rec.quantize import explain as explain_models
from ssl_rec.schema import FeatureSchema
from ssl_rec.types import Batch

log = logging.getLogger(__name__)
EXIT_PAST_BUDGET = 1


def _check_budget(budget_ne: float) -> None:
    if not budget_ne > 0:
        raise ValueError(f"--budget_ne must be > 0 (an NE change such as 0.001), got {budget_ne}")


def _rows(
    datamodule: pl.LightningDataModule, schema: FeatureSchema, split: str, rows: int, role: str
) -> Rows:
    """The first ``rows`` labeled rows of a data module's ``split`` (schema checked)."""
    return labeled_rows(split_loader(datamodule, split), schema, datamodule.schema, rows, role,
                        split)  # fmt: skip


def quantize(
    ckpt_path: str,
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
        ckpt_path: CTR checkpoint written by ``ssl-rec fit``; its best model is
            ``<default_root_dir>/checkpoints/best.ckpt`` (best validation AUC).
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
    _check_budget(budget_ne)
    refuse_existing_output(out, overwrite)
    module, source = load_ctr(ckpt_path)
    datamodule = datamodule_from(ckpt_path, data, module, use_labels=True)
    calibration = _rows(datamodule, source.schema, calibration_split, calibration_rows,
                        "calibration")  # fmt: skip
    evaluation = _rows(datamodule, source.schema, evaluation_split, evaluation_rows,
                       "evaluation")  # fmt: skip
    report = quantize_to_directory(
        source, calibration, evaluation, out, budget_ne, tiny_rows=tiny_rows,
        tiny_weights=tiny_weights, min_pair_agreement=min_pair_agreement,
        speed_models={"trained_module": lambda dense, sparse: module(Batch(dense, sparse))},
        splits={"calibration": calibration_split, "evaluation": evaluation_split},
        explain_result=explain, extra={
            "source": {"checkpoint": str(ckpt_path)},
            "data": read_checkpoint(ckpt_path).get("datamodule_hyper_parameters"),
        }, vocabularies=getattr(module, "vocabulary", None), overwrite=overwrite,
    )  # fmt: skip
    if explain:
        print(format_explanation(report["explanation"]))
    print(format_summary(report, out))
    return report


def _reference_and_candidate(
    ckpt_path: str, candidate: str
) -> tuple[FloatCTR, InferenceCTRModel, InferenceCTRModel]:
    _, source = load_ctr(ckpt_path)
    model = load_quantized(candidate)
    check_schema(source.schema, model.schema, f"the quantized model {candidate}")
    return source, ModelBuilder(source).build(source.fp32_plan()), model


def explain_command(
    ckpt_path: str,
    candidate: str,
    data: pl.LightningDataModule | None = None,
    split: str = "val",
    rows: int = 16384,
    json_out: str | None = None,
) -> dict[str, Any]:
    """Compare a quantized model with its FP32 checkpoint layer by layer; name the culprit.

    Args:
        ckpt_path: the CTR checkpoint the model was quantized from.
        candidate: the quantized model directory.
        data: data module (default: the one recorded in the checkpoint).
        split: split whose rows are compared.
        rows: rows used (NE attribution on all of them, activations on the first 4096).
        json_out: also write the full comparison here as JSON.

    """
    source, fp32, model = _reference_and_candidate(ckpt_path, candidate)
    datamodule = datamodule_from(ckpt_path, data, fp32, use_labels=True)
    sample = _rows(datamodule, source.schema, split, rows, "explain")
    result = explain_models(fp32, model, sample)
    print(format_explanation(result))
    if json_out:
        atomic_write_json(json_out, result)
    return result


def monitor(
    ckpt_path: str,
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
        ckpt_path: the CTR checkpoint the model was quantized from (or retrained since).
        candidate: the quantized model directory.
        data: data module of the new slice (default: the one recorded in the checkpoint).
        split: split of ``data`` to compare on.
        budget_ne: allowed NE change (default: the budget the model was quantized with).
        rows: rows of ``split`` used.
        json_out: also write the comparison here as JSON.

    """
    source, fp32, model = _reference_and_candidate(ckpt_path, candidate)
    report = read_report(candidate)
    budget = report.get("budget_ne", 0.001) if budget_ne is None else budget_ne
    _check_budget(budget)
    datamodule = datamodule_from(ckpt_path, data, fp32, use_labels=True)
    sample = _rows(datamodule, source.schema, split, rows, "monitored")
    result = compare_on_slice(fp32, model, sample, budget, report.get("tables"))
    print(format_comparison(result))
    if json_out:
        atomic_write_json(json_out, result)
    if not result["passed"]:
        raise SystemExit(EXIT_PAST_BUDGET)
    return result


def _cli(function: Any, argv: Sequence[str]) -> Any:
    return CLI(function, args=list(argv), as_positional=False, exit_on_error=False,
               epilog=ALLOW_HELP)  # fmt: skip


def quantize_main(argv: Sequence[str]) -> dict[str, Any]:
    """Entry of ``ssl-rec quantize``; ``--help`` lists the flags."""
    return _cli(quantize, argv)


def explain_main(argv: Sequence[str]) -> dict[str, Any]:
    """Entry of ``ssl-rec explain``; ``--help`` lists the flags."""
    return _cli(explain_command, argv)


def monitor_main(argv: Sequence[str]) -> dict[str, Any]:
    """Entry of ``ssl-rec monitor``; ``--help`` lists the flags."""
    return _cli(monitor, argv)
