"""Resuming a checkpoint written at an epoch's end: the next epoch if it finished, else the rest.

Finished epoch. Lightning 2.6 keeps a fit loop "restarting" when ``max_steps`` is set even if
the saved epoch had finished (a ``last.ckpt`` of ``on_train_epoch_end``): it then runs that
epoch's end a second time, counting it twice, so a fit resumed with ``max_steps`` and
``max_epochs`` stops one epoch early and later epochs use the next epoch's shuffle. Without
``max_steps`` Lightning resumes such a checkpoint at the next epoch's start;
:func:`resume_after_finished_epoch` does the same with it.

Unfinished epoch. When ``max_steps`` is reached inside an epoch, Lightning still ends that
epoch: it counts it as processed and runs ``on_train_epoch_end``, where the checkpoint
callbacks write ``last.ckpt`` (and top-k files). Such a checkpoint holds the loader's
position inside the epoch, but its loop counters say the epoch was done, so every resume
started the next epoch and skipped the rest of this one. :func:`save_unfinished_epoch` saves
the loop state of the epoch's last step instead, which Lightning resumes inside the epoch.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.loops.fit_loop import RestartStage
from pytorch_lightning.loops.loop import _Loop

__all__ = ["resume_after_finished_epoch", "save_unfinished_epoch"]


def resume_after_finished_epoch(trainer: pl.Trainer) -> bool:
    """At ``on_train_start``: start a resumed step-limited fit at the epoch after a finished one.

    Returns:
        Whether the fit loop was changed (it restarted at a finished epoch's end, with
        ``max_steps`` set).

    """
    loop = trainer.fit_loop
    if not (loop.restarted_on_epoch_end and trainer.max_steps != -1):
        return False
    # What Lightning's fit loop does for the same checkpoint without max_steps.
    _Loop.restarting.fset(loop, False)  # the loop and its child loops
    loop.epoch_progress.increment_completed()
    loop._restart_stage = RestartStage.RESUMED_ON_EPOCH_END
    loop.epoch_loop.reset_restart_stage()
    return True


def save_unfinished_epoch(trainer: pl.Trainer, checkpoint: dict[str, Any]) -> bool:
    """At ``on_save_checkpoint``: save an epoch that ended before its last batch as unfinished.

    A checkpoint written during an epoch's end (the epoch counted as processed, not yet as
    completed) while the epoch still has batches to read (``max_steps`` reached, or a stop
    requested inside the epoch) gets the loop counters that a ``last.ckpt`` written at the end
    of the epoch's last step (``on_train_batch_end``) has: the epoch not processed, the last
    batch not completed and not yet counted for the loggers. The resumed fit then continues
    the epoch with its next batch, as after a Ctrl-C.

    Args:
        trainer: the trainer saving ``checkpoint``.
        checkpoint: the checkpoint being saved; its ``loops`` entry is changed in place.

    Returns:
        Whether the checkpoint was changed.

    """
    fit = checkpoint.get("loops", {}).get("fit_loop")
    if fit is None or trainer.fit_loop.epoch_loop._num_ready_batches_reached():
        return False
    epochs = fit["epoch_progress"]
    if epochs["total"]["processed"] != epochs["total"]["completed"] + 1:
        return False  # not inside an epoch's end: a step's or a validation's checkpoint
    for progress in (epochs["total"], epochs["current"]):
        progress["processed"] -= 1
    batches = fit["epoch_loop.batch_progress"]
    for progress in (batches["total"], batches["current"]):
        progress["completed"] -= 1
    if not trainer.fit_loop._should_accumulate():
        # Counted after on_train_batch_end; Lightning adds it back when it resumes there.
        fit["epoch_loop.state_dict"]["_batches_that_stepped"] -= 1
    return True
