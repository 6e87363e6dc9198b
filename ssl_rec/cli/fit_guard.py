"""What ``ssl-rec fit`` checks before it trains: its run directory and the run it resumes.

:class:`FitGuard` holds the run directory's lock for the whole command
(:mod:`ssl_rec.cli.run_dir`), refuses a fit into another run's directory, and for
``--ckpt_path`` compares the command's configuration with the checkpoint's
(:mod:`ssl_rec.cli.resume_config`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import filelock
import pytorch_lightning as pl
import yaml
from jsonargparse import ArgumentParser, Namespace
from pytorch_lightning.core.optimizer import _init_optimizers_and_lr_schedulers

from ssl_rec.cli.named_checkpoints import resolve_named_checkpoint
from ssl_rec.cli.resume_config import check_resume, log_trainer_changes
from ssl_rec.cli.run_dir import (
    check_fresh_run,
    is_global_rank_zero,
    lock_directories,
    lock_run,
    release_run,
)
from ssl_rec.distributed.dcp_checkpoint import read_distributed_checkpoint
from ssl_rec.lightning.checkpoint_extras import VOCABULARY_KEY
from ssl_rec.lightning.checkpoint_loading import (
    DM_HPARAMS,
    HPARAMS,
    check_checkpoint_classes,
    check_checkpoint_file,
    read_checkpoint,
)


class FitGuard:
    """The run directory lock and the resume checks of one ``fit`` command.

    Call :meth:`before_instantiate` with the parsed config, :meth:`after_instantiate` with
    the built model and data module, and :meth:`release` when the command ends (whether it
    succeeded or not).
    """

    def __init__(self) -> None:
        self._locks: list[filelock.BaseFileLock] = []
        self._checkpoint: tuple[str, dict] | None = None

    def before_instantiate(
        self, parser: ArgumentParser, config: Namespace
    ) -> tuple[str, dict] | None:
        """Read the checkpoint resumed (if any), lock the run directory, refuse another run's.

        The checkpoint of ``--ckpt_path`` is read (class paths, checksums) and the class
        paths of ``--model.init_from``'s checked before the run directory is made, so a
        refused checkpoint leaves no file.

        Only the first process of a distributed run locks: the others share its directory.

        Returns:
            ``(path, checkpoint)`` of the checkpoint resumed, else ``None``; of a sharded
            checkpoint directory only its hyperparameters are read.

        Raises:
            RunDirectoryBusy: another fit holds the directory.
            ValueError: the directory holds another run's checkpoints.

        """
        resolve_named_checkpoint(config, "fit")  # --ckpt_path last: the file, or one line
        path = resumed_file(config)
        # read before the run directory is locked (made): a refused checkpoint leaves nothing
        checkpoint = read_resumed(path) if path is not None else None
        init_from = config.get("model.init_args.init_from")
        if init_from and Path(str(init_from)).exists():
            check_classes(str(init_from))
        if is_global_rank_zero():
            self._locks = lock_run(lock_directories(config))
        check_fresh_run(config)
        if path is None or checkpoint is None:
            return None
        self._checkpoint = (path, checkpoint)
        if is_global_rank_zero():
            try:
                current = yaml.safe_load(parser.dump(config, skip_none=False))
            except Exception:  # noqa: BLE001 - only log lines would be lost
                current = None
            if isinstance(current, dict):
                log_trainer_changes(current, config.trainer.default_root_dir or ".")
        return self._checkpoint

    def after_instantiate(self, model: Any, datamodule: Any, trainer: pl.Trainer) -> None:
        """Compare the built model and data with the checkpoint resumed (then let it go).

        The resumed optimizers get the command's settings back (:class:`ConfiguredOptimizers`).

        Raises:
            ValueError: a structural setting differs (one line naming the key and both values).

        """
        if self._checkpoint is None:
            return
        path, checkpoint = self._checkpoint
        self._checkpoint = None  # the trainer loads it again; do not keep two copies
        check_resume(model, datamodule, checkpoint, path)
        trainer.callbacks.append(ConfiguredOptimizers())

    def release(self) -> None:
        """Release the run directory's lock (a no-op if none was taken)."""
        release_run(self._locks)


class ConfiguredOptimizers(pl.Callback):
    """After a resume, step with the command's optimizer settings, not the checkpoint's.

    Lightning restores each optimizer's ``state_dict``, whose parameter groups carry the
    learning rate and weight decay of the run that saved it; here those settings are set
    back to what the module's ``configure_optimizers`` asks for now (the per-parameter state,
    Adam's moments, is kept). Runs with a learning-rate scheduler keep the restored values:
    the scheduler's own state continues its schedule from them.
    """

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Copy the fresh optimizers' group settings into the restored ones."""
        if trainer.lr_scheduler_configs:
            return
        fresh, _ = _init_optimizers_and_lr_schedulers(pl_module)
        for live, new in zip(trainer.optimizers, fresh, strict=False):
            for group, wanted in zip(live.param_groups, new.param_groups, strict=False):
                group.update({k: v for k, v in wanted.items() if k != "params"})


def resumed_file(config: Namespace) -> str | None:
    """The checkpoint ``--ckpt_path`` resumes, if it exists (a file or a sharded directory).

    ``last`` / ``best`` are already files here (:func:`resolve_named_checkpoint`).
    """
    ckpt_path = config.get("ckpt_path")
    return str(ckpt_path) if ckpt_path and Path(str(ckpt_path)).exists() else None


def check_classes(path: str) -> None:
    """Refuse checkpoint ``path`` (a file or sharded directory) naming an unallowed class.

    Only its configs are read (a file's tensors are memory-mapped, not read).
    """
    if Path(path).is_dir():
        read_resumed(path)
    else:
        check_checkpoint_file(path)


def read_resumed(path: str) -> dict:
    """Checkpoint ``path`` as far as the resume checks need it (class paths checked).

    A sharded checkpoint directory gives only its hyperparameters and vocabulary (the data
    of the resumed run is encoded with it): every process of a sharded run would otherwise
    hold all tables at once, and its saved tensors are compared with the model by the
    strategy's load. A directory without the library's manifest is refused here in one line.
    """
    if not Path(path).is_dir():  # tables stay in the file: the checks compare shapes
        return read_checkpoint(path, mapped=True)
    checkpoint = read_distributed_checkpoint(path, keys={HPARAMS, DM_HPARAMS, VOCABULARY_KEY})
    return check_checkpoint_classes(checkpoint, path)
