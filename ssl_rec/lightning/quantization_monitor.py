"""``QuantizationMonitor``: watch, during (continued) training, what serving quantized would cost.

After a validation epoch the callback quantizes the model as it is now with a fixed plan
(the precisions a quantized model directory chose, or a default), compares it with the
FP32 model on the validation rows it saw (:func:`ssl_rec.quantize.compare_on_slice`) and
logs the result; past the NE budget it warns and, if asked, stops training, so a scheduler
can quantize again.
"""

from __future__ import annotations

import logging
from typing import Any

import pytorch_lightning as pl

from ssl_rec._checks import check_at_least, check_positive
from ssl_rec.quantize import (
    FloatCTR,
    ModelBuilder,
    QuantizationPlan,
    Rows,
    compare_on_slice,
    read_manifest,
    read_report,
)
from ssl_rec.quantize.serving_wide import ServingWide
from ssl_rec.types import Batch

__all__ = ["QuantizationMonitor"]

log = logging.getLogger(__name__)
DEFAULT_TABLES, DEFAULT_LAYERS = "int8", "bf16"


class QuantizationMonitor(pl.Callback):
    """Log the NE change of the model quantized with a fixed plan after each validation.

    Logged: ``quantize/ne_change``, ``quantize/auc_change``, ``quantize/within_budget``.

    Args:
        plan_from: a quantized model directory (``ssl-rec quantize --out``) whose
            precisions are reused; ``None`` puts every table in INT8 and every layer in
            bfloat16.
        budget_ne: allowed NE change; ``None`` takes the directory's budget, else 0.001.
        max_rows: validation rows compared (the first ones of each validation epoch).
        every_n_epochs: compare after every n-th validation epoch.
        stop_on_breach: stop training when the NE change is past the budget.

    Example:
        >>> QuantizationMonitor().budget_ne  # every table INT8, every layer bfloat16
        0.001
        >>> monitor = QuantizationMonitor("runs/quantized")  # doctest: +SKIP

    """

    def __init__(
        self,
        plan_from: str | None = None,
        budget_ne: float | None = None,
        max_rows: int = 65536,
        every_n_epochs: int = 1,
        stop_on_breach: bool = False,
    ) -> None:
        super().__init__()
        self.plan_from, self.stop_on_breach = plan_from, stop_on_breach
        self.max_rows = check_at_least("QuantizationMonitor", "max_rows", max_rows)
        self.every_n_epochs = check_at_least(
            "QuantizationMonitor", "every_n_epochs", every_n_epochs
        )
        self.plan = (
            QuantizationPlan.from_dict(read_manifest(plan_from)["plan"]) if plan_from else None
        )
        if budget_ne is None:
            budget_ne = read_report(plan_from).get("budget_ne", 1e-3) if plan_from else 1e-3
        self.budget_ne = check_positive("QuantizationMonitor", "budget_ne", budget_ne)
        self._batches: list[Batch] = []
        self.last_result: dict[str, Any] | None = None

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start collecting this epoch's validation rows."""
        self._batches = []

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Keep labeled batches until ``max_rows`` rows are held."""
        held = sum(b.batch_size for b in self._batches)
        if isinstance(batch, Batch) and batch.label is not None and held < self.max_rows:
            self._batches.append(batch.to("cpu"))

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Quantize the current model, compare, log, and warn or stop past the budget."""
        if trainer.sanity_checking or not self._batches:
            return
        if (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        result = self.compare(
            pl_module, Rows.from_batches(self._batches, self.max_rows, "validation rows")
        )
        self.last_result = result
        change = result["candidate"]["auc"] - result["reference"]["auc"]
        pl_module.log_dict(
            {
                "quantize/ne_change": result["ne_change"],
                "quantize/auc_change": change,
                "quantize/within_budget": float(result["passed"]),
            }
        )
        if not result["passed"]:
            log.warning(
                "quantized model past its NE budget: change %+.2e, budget %g (epoch %d)",
                result["ne_change"],
                self.budget_ne,
                trainer.current_epoch,
            )
            if self.stop_on_breach:
                trainer.should_stop = True

    def compare(self, pl_module: pl.LightningModule, rows: Rows) -> dict[str, Any]:
        """The comparison of ``pl_module`` (a CTR module) and its quantized twin on ``rows``."""
        backbone, head = getattr(pl_module, "backbone", None), getattr(pl_module, "head", None)
        if backbone is None or head is None:
            raise ValueError(
                f"QuantizationMonitor needs a CTR module (backbone and head), got "
                f"{type(pl_module).__name__}"
            )
        wide = getattr(pl_module, "wide", None)  # CTRModule(wide=True): served in FP32
        wide = None if wide is None else ServingWide.from_wide(wide)
        source = FloatCTR.from_backbone(backbone, head, wide=wide)
        builder = ModelBuilder(source)
        plan = self.plan or self.default_plan(source)
        if plan.tables.keys() != source.fp32_plan().tables.keys() or (
            plan.layers.keys() != source.fp32_plan().layers.keys()
        ):
            raise ValueError(
                f"{self.plan_from}: its plan names other tables or layers than "
                "the model being trained"
            )
        return compare_on_slice(
            builder.build(source.fp32_plan()), builder.build(plan), rows, self.budget_ne
        )

    @staticmethod
    def default_plan(source: FloatCTR) -> QuantizationPlan:
        """INT8 tables and bfloat16 layers (no search)."""
        plan = source.fp32_plan()
        return QuantizationPlan(
            dict.fromkeys(plan.tables, DEFAULT_TABLES), dict.fromkeys(plan.layers, DEFAULT_LAYERS)
        )
