"""Stop training on non-finite values instead of writing a NaN model.

A loss is checked before its backward, because the embedding tables' optimizer is fused into
backward: one NaN gradient would write NaN rows. Embedding rows and dense parameters are
checked in full before each validation and before each checkpoint is written (once per
global step), so no checkpoint holds a non-finite weight.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn

from ssl_rec.hardware.collection import MixedPrecisionEmbeddingCollection
from ssl_rec.hardware.table import EmbeddingTable

HINT = "lower the learning rate, or look for extreme values in the data"
CHUNK_ROWS = 65_536


class NonFiniteError(FloatingPointError, ValueError):
    """Training produced a NaN or infinite value.

    A ``ValueError`` too, so the command line reports it in one line with exit status 2.
    """


def check_finite_loss(loss: torch.Tensor, what: str, step: int) -> None:
    """Raise :class:`NonFiniteError` naming ``what`` and ``step`` if ``loss`` is not finite.

    Args:
        loss: a scalar loss tensor.
        what: which loss, e.g. ``"the CTR loss"`` or ``"the train loss of objective 'mfp'"``.
        step: the trainer's global step.

    """
    if not bool(torch.isfinite(loss.detach()).all()):
        raise NonFiniteError(
            f"step {step}: {what} is {float(loss.detach().float().reshape(-1)[0])}; "
            f"training stopped ({HINT})"
        )


def _nonfinite(rows: torch.Tensor) -> torch.Tensor:
    """``bool[n]``: which rows of ``[n, k]`` hold a NaN or infinity."""
    # A row sum is non-finite when the row is (16x faster than isfinite().all(dim=1));
    # finite rows whose sum overflows are cleared by the exact test on the suspects.
    suspect = ~torch.isfinite(rows.sum(dim=1, dtype=torch.float32))
    if bool(suspect.any()):
        suspect[suspect.clone()] = ~torch.isfinite(rows[suspect]).all(dim=1)
    return suspect


def nonfinite_rows(table: EmbeddingTable, chunk_rows: int = CHUNK_ROWS) -> tuple[int, int | None]:
    """Count the rows of one table holding a NaN or infinite value.

    Integer codes are always finite, so a quantized store is checked through its rows'
    scales and biases only; a float store in full; the FP32 cache's rows in full.

    Args:
        table: the table.
        chunk_rows: store rows read at a time (bounds the temporary memory).

    Returns:
        ``(count, first bad id of the store or None)``.

    """
    qparam = table.spec.precision.qparam_bytes
    count, first = 0, None
    for start in range(0, table.num_rows, chunk_rows):
        block = table.store[start : start + chunk_rows]
        if qparam:
            block = (
                block[:, -qparam:]
                .contiguous()
                .view(torch.float32 if qparam == 8 else torch.float16)
            )
        bad = _nonfinite(block)
        n = int(bad.sum())
        if n and first is None:
            first = table.row_offset + (start + int(bad.nonzero()[0, 0])) * table.row_stride
        count += n
    count += int(_nonfinite(table.cache.rows).sum())
    return count, first


def check_finite_weights(module: nn.Module, step: int, chunk_rows: int = CHUNK_ROWS) -> None:
    """Raise :class:`NonFiniteError` naming the first non-finite table or dense parameter.

    Args:
        module: the LightningModule (every :class:`MixedPrecisionEmbeddingCollection` in
            it and every parameter are checked).
        step: the trainer's global step, for the message.
        chunk_rows: store rows read at a time.

    """
    with torch.no_grad():
        for tables in module.modules():
            if not isinstance(tables, MixedPrecisionEmbeddingCollection) or tables.declared:
                continue  # declared tables hold no values yet
            tables.group.wait()
            for table, name in zip(tables.group.tables, tables.table_names, strict=True):
                count, first = nonfinite_rows(table, chunk_rows)
                if count:
                    where = "a cached row" if first is None else f"id {first}"
                    raise NonFiniteError(
                        f"step {step}: embedding table {name!r} has {count} non-finite rows "
                        f"(first: {where}); training stopped ({HINT})"
                    )
        for name, param in module.named_parameters():
            if not bool(torch.isfinite(param).all()):
                raise NonFiniteError(
                    f"step {step}: parameter {name!r} has non-finite values; training "
                    f"stopped ({HINT})"
                )


def loss_description(module: nn.Module) -> str:
    """What a module's training loss is, for messages (CTR loss or the objectives' sum)."""
    objectives = getattr(module, "objectives", None)
    names = list(objectives) if isinstance(objectives, nn.ModuleDict) else []
    if type(module).__name__ == "CTRModule":
        extra = f" plus weighted objectives {names}" if names else ""
        return f"the CTR loss (binary cross-entropy{extra})"
    if names:
        return f"the training loss (weighted sum of objectives {names})"
    return f"the training loss of {type(module).__name__}"


class FiniteChecks(pl.Callback):
    """Stop ``fit`` with one clear error on a non-finite loss or non-finite weights.

    Registered by ``ssl-rec`` for every run (``--finite_checks.loss false`` /
    ``--finite_checks.weights false`` turn either off).

    Args:
        loss: check each loss before its backward (a host sync per step; on CPU it costs
            nothing measurable).
        weights: check every embedding row and dense parameter before each validation and
            each checkpoint (a full pass over the tables: about 0.1 s per million rows of
            D = 64 on one core).
        chunk_rows: store rows read at a time by the weights check.

    """

    def __init__(self, loss: bool = True, weights: bool = True,
                 chunk_rows: int = CHUNK_ROWS) -> None:  # fmt: skip
        super().__init__()
        if chunk_rows < 1:
            raise ValueError(f"FiniteChecks.chunk_rows must be >= 1, got {chunk_rows}")
        self.loss, self.weights, self.chunk_rows = loss, weights, chunk_rows
        self._checked_step: int | None = None

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           loss: torch.Tensor) -> None:  # fmt: skip
        """Check the loss before backward writes its gradients into the tables."""
        if self.loss:
            check_finite_loss(loss, loss_description(pl_module), trainer.global_step)

    def _check_weights(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.weights or self._checked_step == trainer.global_step:
            return
        check_finite_weights(pl_module, trainer.global_step, self.chunk_rows)
        self._checked_step = trainer.global_step

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Check the weights before they are validated."""
        self._check_weights(trainer, pl_module)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:  # fmt: skip
        """Check the weights before a checkpoint holding them is written."""
        self._check_weights(trainer, pl_module)
