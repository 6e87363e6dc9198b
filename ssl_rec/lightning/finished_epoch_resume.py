"""Resuming a checkpoint written at an epoch's end continues with the next epoch.

Lightning 2.6 keeps a fit loop "restarting" when ``max_steps`` is set even if the saved
epoch had finished (a ``last.ckpt`` of ``on_train_epoch_end``): it then runs that epoch's
end a second time, counting it twice, so a fit resumed with ``max_steps`` and
``max_epochs`` stops one epoch early and later epochs use the next epoch's shuffle. Without
``max_steps`` Lightning resumes such a checkpoint at the next epoch's start; this does the
same with it.
"""

from __future__ import annotations

import pytorch_lightning as pl
from pytorch_lightning.loops.fit_loop import RestartStage
from pytorch_lightning.loops.loop import _Loop

__all__ = ["resume_after_finished_epoch"]


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
