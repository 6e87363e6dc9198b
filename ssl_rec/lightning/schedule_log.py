"""``ScheduleLog``: one line when a fit starts and one when it ends, about its schedule.

A schedule fits the data only if one can see it: the start line gives the training batch
size, the optimizer steps per epoch and the epoch cap (with the early-stopping rule, if
any); the end line gives the optimizer steps taken and why training stopped (early
stopping, ``max_epochs``, ``max_steps``).
"""

from __future__ import annotations

import logging
import math

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback, EarlyStopping
from pytorch_lightning.callbacks.early_stopping import EarlyStoppingReason
from pytorch_lightning.trainer.states import TrainerFn

__all__ = ["ScheduleLog", "stop_reason"]

log = logging.getLogger(__name__)


def _early_stopping(trainer: pl.Trainer) -> EarlyStopping | None:
    found = [c for c in trainer.callbacks if isinstance(c, EarlyStopping)]
    return found[0] if found else None


def stop_reason(trainer: pl.Trainer) -> str:
    """Why a fit that ended normally stopped, in words.

    Args:
        trainer: the trainer after (or at the end of) ``fit``.

    Returns:
        e.g. ``"val/auc did not improve for 3 validations (best 0.8870)"`` or
        ``"max_epochs=50 reached"``.

    """
    stopper = _early_stopping(trainer)
    if stopper is not None and stopper.stopping_reason != EarlyStoppingReason.NOT_STOPPED:
        if stopper.stopping_reason == EarlyStoppingReason.PATIENCE_EXHAUSTED:
            return (
                f"{stopper.monitor} did not improve for {stopper.wait_count} validations "
                f"(best {float(stopper.best_score):.4f})"
            )
        return stopper.stopping_reason_message or str(stopper.stopping_reason.value)
    if trainer.max_steps != -1 and trainer.global_step >= trainer.max_steps:
        return f"max_steps={trainer.max_steps} reached"
    if trainer.max_epochs is not None and trainer.current_epoch >= trainer.max_epochs:
        return f"max_epochs={trainer.max_epochs} reached"
    return "stopped by a callback"


class ScheduleLog(Callback):
    """Log the fit's batch size, steps per epoch and epoch cap; at the end, why it stopped.

    Example:
        >>> ScheduleLog()  # doctest: +ELLIPSIS
        <...ScheduleLog object at ...>

    """

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The start line: batch size, optimizer steps per epoch, epoch cap and stopping rule."""
        if not self._reports(trainer):
            return
        batches = trainer.num_training_batches
        steps = math.ceil(batches / trainer.accumulate_grad_batches) if batches else 0
        size = getattr(trainer.train_dataloader, "batch_size", None)
        text = f"training at batch size {size}: " if size else "training: "
        text += f"{steps} optimizer steps per epoch"
        if trainer.max_epochs is not None and trainer.max_epochs >= 0:
            text += f", at most {trainer.max_epochs} epochs"
        if trainer.max_steps != -1:
            text += f", at most {trainer.max_steps} steps"
        stopper = _early_stopping(trainer)
        if stopper is not None:
            text += (
                f"; early stopping when {stopper.monitor} has not improved for "
                f"{stopper.patience} validations"
            )
        log.info("%s", text)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The end line: optimizer steps and epochs done, and why training stopped."""
        if not self._reports(trainer):
            return
        log.info(
            "training stopped after %d optimizer steps (%d epochs): %s",
            trainer.global_step, trainer.current_epoch, stop_reason(trainer),
        )  # fmt: skip

    @staticmethod
    def _reports(trainer: pl.Trainer) -> bool:
        return (
            trainer.is_global_zero
            and trainer.state.fn == TrainerFn.FITTING
            and not trainer.fast_dev_run
        )
