"""Run directories whose files cannot mislead.

- A ``fit`` into a ``default_root_dir`` that already holds checkpoints is refused (unless
  it resumes one with ``--ckpt_path``): ``checkpoints/last.ckpt`` always belongs to the
  run that wrote the directory, so ``ssl-rec test --ckpt_path .../last.ckpt`` never
  scores an older model than the user thinks.
- ``config.yaml`` is the fit's; ``validate``, ``test`` and ``predict`` write
  ``<command>_config.yaml`` beside it instead of overwriting it.
- A run directory holds one fit at a time: ``fit`` takes an exclusive lock
  (``<default_root_dir>/.ssl_rec.lock``, and the same file in a checkpoint directory outside
  it) for the whole run, and a second ``fit`` into a busy directory is refused with the
  holder's process id. The lock is an ``flock``: the operating system releases it when its
  process dies, so a killed run never blocks the next one.
"""

from __future__ import annotations

import importlib
import os
import socket
from pathlib import Path

import filelock
import pytorch_lightning as pl
from jsonargparse import Namespace
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.cli import SaveConfigCallback

from ssl_rec.cli.errors import OperatorError

LOCK_FILENAME = ".ssl_rec.lock"
# Set by launchers (torchrun, SLURM, LSF, Lightning's own DDP launcher) in every process but
# the first one of a run: any of them non-zero means another process of this run holds the lock.
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID",
                   "JSM_NAMESPACE_RANK")  # fmt: skip


def is_checkpoint_callback(callback: object) -> bool:
    """Whether a callback's config (``class_path`` + ``init_args``) is a ``ModelCheckpoint``.

    Subclasses count (``ssl_rec.lightning.resume_checkpoint.ResumeCheckpoint``); the class is
    imported to tell, as instantiating the config does anyway.
    """
    class_path = str(getattr(callback, "class_path", ""))
    if class_path.endswith("ModelCheckpoint"):
        return True
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, ModelCheckpoint)


def checkpoint_dirs(config: Namespace) -> list[Path]:
    """The ``dirpath`` of every ``ModelCheckpoint`` in a subcommand's config."""
    dirs = []
    for callback in config.trainer.get("callbacks") or []:
        if is_checkpoint_callback(callback):
            dirpath = (getattr(callback, "init_args", None) or {}).get("dirpath")
            if dirpath:
                dirs.append(Path(dirpath))
    return dirs


def check_fresh_run(config: Namespace) -> None:
    """Refuse a ``fit`` into a directory holding another run's checkpoints.

    Raises:
        ValueError: one line naming the directory, the checkpoint found and the ways out.

    """
    if config.get("ckpt_path"):
        return  # resuming continues the run that owns the directory
    root = Path(config.trainer.default_root_dir or ".")
    for directory in checkpoint_dirs(config) or [root / "checkpoints"]:
        found = sorted(directory.glob("*.ckpt")) if directory.is_dir() else []
        if found:
            raise ValueError(
                f"{root} already holds a fit ({found[-1]}); use another "
                "--trainer.default_root_dir, delete it, or resume with --ckpt_path "
                f"{directory / 'last.ckpt'}"
            )


class RunDirectoryBusy(OperatorError):
    """Another process holds the lock of a run directory (an operator error: exit status 2)."""


def is_global_rank_zero() -> bool:
    """Whether this process is the first of its run (no launcher set a non-zero rank)."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value not in ("", "0"):
            return False
    return True


def lock_directories(config: Namespace) -> list[Path]:
    """The directories a ``fit`` locks: ``default_root_dir`` and checkpoint dirs outside it."""
    root = Path(config.trainer.default_root_dir or ".").absolute()
    dirs = [root]
    for directory in checkpoint_dirs(config):
        directory = directory.absolute()
        if directory != root and root not in directory.parents and directory not in dirs:
            dirs.append(directory)
    return dirs


def lock_run(directories: list[Path]) -> list[filelock.BaseFileLock]:
    """Take the run lock of every directory without waiting; the caller releases them.

    The holder's process id and host are written into each lock file for the message a
    second run gets.

    Raises:
        RunDirectoryBusy: naming the directory and the holder; locks taken so far are released.

    """
    held: list[filelock.BaseFileLock] = []
    try:
        for directory in directories:
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / LOCK_FILENAME
            lock = filelock.FileLock(str(path), timeout=0)
            try:
                lock.acquire()
            except filelock.Timeout:
                raise RunDirectoryBusy(
                    f"{directory} is in use by another fit ({lock_holder(path)}); wait for it "
                    "to end or use another --trainer.default_root_dir"
                ) from None
            held.append(lock)
            path.write_text(f"pid {os.getpid()} on {socket.gethostname()}\n")
    except BaseException:
        release_run(held)
        raise
    return held


def lock_holder(path: Path) -> str:
    """What the lock file at ``path`` says about its holder (``pid N on HOST``)."""
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        text = ""
    return text.splitlines()[0][:200] if text else "pid unknown"


def release_run(locks: list[filelock.BaseFileLock]) -> None:
    """Release run locks taken by :func:`lock_run` (the lock files stay, emptied)."""
    for lock in reversed(locks):
        if lock.is_locked:
            Path(lock.lock_file).write_text("")  # while held: no other holder's pid to erase
            lock.release(force=True)
    locks.clear()


def refuse_existing_output(out: str | os.PathLike[str], overwrite: bool) -> None:
    """Refuse to replace a command's output directory unless ``--overwrite true`` was given.

    Checked before the command's work, in the command line's spelling (the Python API's
    ``atomic_directory`` says ``overwrite=True``).

    Raises:
        FileExistsError: ``out`` exists and ``overwrite`` is false.

    """
    if not overwrite and Path(out).exists():
        raise FileExistsError(f"{out} already exists; pass --overwrite true to replace it")


class RunConfig(SaveConfigCallback):
    """Save the command's config: ``config.yaml`` for ``fit``, ``<command>_config.yaml`` else."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Pick the file name for ``stage`` and save (replacing only this command's file)."""
        stage = str(getattr(stage, "value", stage))
        self.config_filename = "config.yaml" if stage == "fit" else f"{stage}_config.yaml"
        self.overwrite = True
        super().setup(trainer, pl_module, stage)
