"""``ResumeCheckpoint``: a ``ModelCheckpoint`` whose ``last.ckpt`` is recent enough to resume.

Lightning's ``ModelCheckpoint`` writes ``last.ckpt`` only together with a top-k checkpoint
(with a monitored metric, only in the epochs that improve it), so ``fit --ckpt_path last``
after a stop inside an epoch repeats the epoch, or starts from scratch in the first one.
This subclass also writes ``last.ckpt``

- every ``last_interval`` of training time (default 5 minutes), at the end of the step in
  which the interval runs out: the checkpoint holds the training loader's position inside
  the epoch (:class:`ssl_rec.data.loader.BatchLoader` is stateful, Lightning saves it), the
  random generators, the tables with their caches and stochastic-rounding step counters and
  the optimizer states, so the resumed run repeats the uninterrupted one bit for bit;
- at the end of every training epoch, after its validation and its top-k checkpoint; an
  epoch that ``max_steps`` ends inside is saved as unfinished (any checkpoint written at its
  end, :func:`~ssl_rec.lightning.finished_epoch_resume.save_unfinished_epoch`), so the
  resumed run trains the rest of it;
- on Ctrl-C (SIGINT) in a one-process fit: the running step finishes, ``last.ckpt`` is
  written, and the fit stops as Lightning stops on ``KeyboardInterrupt`` (exit status 1).
  A second Ctrl-C stops at once (then the last checkpoint written is the one to resume).

A last-only write does not count as the step's checkpoint for Lightning's own triggers, so
it never makes the epoch's top-k (best) checkpoint be skipped.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from datetime import timedelta
from types import FrameType
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.trainer.states import TrainerFn
from torch import Tensor

from ssl_rec.lightning.finished_epoch_resume import (
    resume_after_finished_epoch,
    save_unfinished_epoch,
)

__all__ = ["ResumeCheckpoint"]

log = logging.getLogger(__name__)


class ResumeCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` that keeps ``last.ckpt`` current (see the module docstring).

    Args:
        last_interval: training time between two writes of ``last.ckpt`` inside an epoch
            (``"h:m:s"`` on the command line; ``0:00:00``: every step); ``None`` writes it
            only at epoch ends, with top-k checkpoints and on Ctrl-C.
        **kwargs: ``ModelCheckpoint``'s arguments (``save_last`` must be set for any of this).

    Example:
        >>> ResumeCheckpoint(monitor="val/auc", mode="max", filename="best", save_last=True)
        ... # doctest: +SKIP

    """

    def __init__(self, last_interval: timedelta | None = timedelta(minutes=5), **kwargs: Any):
        super().__init__(**kwargs)
        if last_interval is not None and last_interval.total_seconds() < 0:
            raise ValueError(f"last_interval must not be negative, got {last_interval}")
        self.last_interval = last_interval
        self._last_written_at = time.monotonic()
        self._last_written: tuple[int, int] | None = None  # (global step, validations run)
        self._validations = 0
        self._stop_requested = False
        self._saved_on_stop = False
        self._previous_sigint: Any = None
        self._sigint_handler = self._on_sigint

    # --- Lightning hooks ----------------------------------------------------------------

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start the interval clock; take over Ctrl-C in a one-process fit."""
        super().on_train_start(trainer, pl_module)
        resume_after_finished_epoch(trainer)  # an epoch-end last.ckpt with max_steps set
        self._last_written_at = time.monotonic()
        self._stop_requested = self._saved_on_stop = False
        if self.save_last and trainer.world_size == 1:
            self._install_sigint()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        """Lightning's step triggers, then ``last.ckpt`` if the interval ran out or on Ctrl-C."""
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        writes = self.save_last and not self._not_fitting(trainer)
        if self._stop_requested:
            if writes:
                self._write_last(trainer)
            self._stop(trainer)
        if not writes or self.last_interval is None:
            return
        due = time.monotonic() - self._last_written_at >= self.last_interval.total_seconds()
        if trainer.strategy.broadcast(due):  # rank 0's clock decides for every rank
            self._write_last(trainer)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Save an epoch that ``max_steps`` ended inside as unfinished (any checkpoint file)."""
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        save_unfinished_epoch(trainer, checkpoint)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Count validations: a ``last.ckpt`` written before one is stale after it."""
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self._validations += 1
        super().on_validation_end(trainer, pl_module)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The epoch's top-k checkpoint, then ``last.ckpt`` (unless already written since)."""
        super().on_train_epoch_end(trainer, pl_module)
        if self.save_last and not self._not_fitting(trainer):
            self._write_last(trainer)
        if self._stop_requested:
            self._stop(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Give Ctrl-C back; a Ctrl-C that came during the last steps still stops the command."""
        super().on_train_end(trainer, pl_module)
        self._restore_sigint()
        if self._stop_requested:
            self._stop(trainer)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Give Ctrl-C back; after an interrupt, say which checkpoint to resume from."""
        super().on_exception(trainer, pl_module, exception)
        self._restore_sigint()
        if isinstance(exception, KeyboardInterrupt) and self.save_last and trainer.is_global_zero:
            if self._saved_on_stop:
                where = f"saved {self.last_model_path} at step {trainer.global_step}"
            elif self.last_model_path:
                where = f"the last checkpoint written is {self.last_model_path}"
            else:
                where = "no checkpoint was written yet: start the fit again without --ckpt_path"
                log.info("ssl-rec: interrupted; %s", where)
                return
            log.info("ssl-rec: interrupted; %s: continue with --ckpt_path last", where)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Give Ctrl-C back whatever ended the fit."""
        self._restore_sigint()
        super().teardown(trainer, pl_module, stage)

    # --- writing last.ckpt --------------------------------------------------------------

    def _save_last_checkpoint(
        self, trainer: pl.Trainer, monitor_candidates: dict[str, Tensor]
    ) -> None:
        """Lightning's write of ``last.ckpt``, remembered with the state it captured."""
        super()._save_last_checkpoint(trainer, monitor_candidates)
        if self.save_last:
            self._last_written = (trainer.global_step, self._validations)
            self._last_written_at = time.monotonic()

    def _write_last(self, trainer: pl.Trainer) -> None:
        """Write ``last.ckpt`` unless it already holds this step (after the same validations)."""
        if self._last_written == (trainer.global_step, self._validations):
            return
        kept = self._last_global_step_saved
        self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        # Lightning skips a step's (and an epoch end's) top-k check once anything was saved at
        # that step; a last-only write must not hide the epoch's best checkpoint.
        self._last_global_step_saved = kept

    @staticmethod
    def _not_fitting(trainer: pl.Trainer) -> bool:
        return (
            bool(trainer.fast_dev_run)
            or trainer.state.fn != TrainerFn.FITTING
            or trainer.sanity_checking
        )

    # --- Ctrl-C -------------------------------------------------------------------------

    def _install_sigint(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        if signal.getsignal(signal.SIGINT) is self._sigint_handler:
            return
        self._previous_sigint = signal.signal(signal.SIGINT, self._sigint_handler)

    def _restore_sigint(self) -> None:
        # Only while ours is installed: Lightning ignores SIGINT during its own shutdown.
        if self._previous_sigint is None:
            return
        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGINT) is self._sigint_handler:
                signal.signal(signal.SIGINT, self._previous_sigint)
        self._previous_sigint = None

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self._stop_requested:  # the second Ctrl-C: stop now
            self._restore_sigint()
            raise KeyboardInterrupt
        self._stop_requested = True
        log.info(
            "\nssl-rec: stopping after this training step to save last.ckpt "
            "(Ctrl-C again to stop now)"
        )

    def _stop(self, trainer: pl.Trainer) -> None:
        """End the fit the way Lightning ends it on Ctrl-C (``last.ckpt`` holds this step)."""
        self._stop_requested = False
        self._saved_on_stop = self._last_written == (trainer.global_step, self._validations)
        self._restore_sigint()
        raise KeyboardInterrupt
