"""``ResumableEarlyStopping``: Lightning's ``EarlyStopping`` that a resumed fit respects.

Two differences from Lightning's callback, both about ``fit --ckpt_path last``:

- a run that had stopped early is finished: resuming it trains nothing (Lightning's would
  train one more epoch and stop again unless that epoch happened to improve);
- the patience is the command's, not the checkpoint's (Lightning's restores the saved
  patience over the configured one): resuming with a larger patience continues the run.

And validations inside a CTR fine-tuning's frozen phase (``freeze_backbone_epochs``) do not
count: the patience starts when the backbone is unfrozen.
"""

from __future__ import annotations

import logging
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import EarlyStopping
from pytorch_lightning.callbacks.early_stopping import EarlyStoppingReason

__all__ = ["ResumableEarlyStopping"]

log = logging.getLogger(__name__)


class ResumableEarlyStopping(EarlyStopping):
    """Stop when ``monitor`` has not improved for ``patience`` validations (see module docstring).

    Args:
        **kwargs: ``EarlyStopping``'s arguments (``monitor``, ``mode``, ``patience``,
            ``min_delta``, ...).

    Example:
        >>> ResumableEarlyStopping(monitor="val/auc", mode="max", patience=3).patience
        3

    """

    def __init__(self, **kwargs: Any) -> None:
        # Checked when a validation ends, never at a training epoch's end: a fit cut short
        # by max_steps, or run without validation, has no val metric there, and Lightning's
        # strict check would end it with a traceback instead of a finished run.
        # (jsonargparse passes EarlyStopping's default None explicitly, hence `or`)
        kwargs["check_on_train_epoch_end"] = kwargs.get("check_on_train_epoch_end") or False
        super().__init__(**kwargs)
        self._configured_patience = self.patience

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Lightning's restore, keeping the configured patience."""
        super().load_state_dict(state_dict)
        self.patience = self._configured_patience

    def _run_early_stopping_check(self, trainer: pl.Trainer) -> None:
        # A head trained alone on a frozen backbone (CTRModule.freeze_backbone_epochs) may
        # plateau before the backbone is unfrozen: the patience counts from its end.
        if getattr(trainer.lightning_module, "backbone_frozen_by_schedule", False):
            return
        super()._run_early_stopping_check(trainer)

    @property
    def stopped_early(self) -> bool:
        """Whether the patience ran out (in this fit or in the run it resumes)."""
        exhausted = self.stopping_reason == EarlyStoppingReason.PATIENCE_EXHAUSTED
        return exhausted and self.wait_count >= self.patience

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A resumed run that had already stopped early trains nothing more."""
        super().on_train_start(trainer, pl_module)
        if self.stopped_early:
            trainer.should_stop = True
            log.info(
                "the resumed run had stopped early at epoch %d (%s did not improve for %d "
                "validations): nothing left to train",
                self.stopped_epoch, self.monitor, self.wait_count,
            )  # fmt: skip
        elif self.stopping_reason == EarlyStoppingReason.PATIENCE_EXHAUSTED:
            # Resumed with a larger patience: the run goes on, and may stop again.
            self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
            self.stopped_epoch = 0
