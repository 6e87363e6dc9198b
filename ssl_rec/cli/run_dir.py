"""Run directories whose files cannot mislead.

- A ``fit`` into a ``default_root_dir`` that already holds checkpoints is refused (unless
  it resumes one with ``--ckpt_path``): ``checkpoints/last.ckpt`` always belongs to the
  run that wrote the directory, so ``ssl-rec test --ckpt_path .../last.ckpt`` never
  scores an older model than the user thinks.
- ``config.yaml`` is the fit's; ``validate``, ``test`` and ``predict`` write
  ``<command>_config.yaml`` beside it instead of overwriting it.
"""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
from jsonargparse import Namespace
from pytorch_lightning.cli import SaveConfigCallback


def checkpoint_dirs(config: Namespace) -> list[Path]:
    """The ``dirpath`` of every ``ModelCheckpoint`` in a subcommand's config."""
    dirs = []
    for callback in config.trainer.get("callbacks") or []:
        if str(getattr(callback, "class_path", "")).endswith("ModelCheckpoint"):
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


class RunConfig(SaveConfigCallback):
    """Save the command's config: ``config.yaml`` for ``fit``, ``<command>_config.yaml`` else."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Pick the file name for ``stage`` and save (replacing only this command's file)."""
        stage = str(getattr(stage, "value", stage))
        self.config_filename = "config.yaml" if stage == "fit" else f"{stage}_config.yaml"
        self.overwrite = True
        super().setup(trainer, pl_module, stage)
