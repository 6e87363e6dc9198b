"""One place per run: where the outputs of a command go, and which W&B run it logs into.

- ``validate``, ``test`` and ``predict`` with ``--ckpt_path CKPT`` write beside CKPT's run:
  its run directory (the parent of ``checkpoints/`` when that holds the fit's
  ``config.yaml``), else the directory of the checkpoint file; never into the working
  directory. ``--trainer.default_root_dir DIR`` on the command line puts them in ``DIR``.
- A command never replaces an earlier result: ``test`` refuses when ``metrics.json`` or
  ``test_config.yaml`` is there, ``validate`` when ``validate_config.yaml`` is, ``predict``
  when its predictions file or ``predict_config.yaml`` is, unless ``--overwrite true``.
- W&B: each ``fit`` is one run, named after its run directory, in the group
  ``$WANDB_RUN_GROUP`` (else the run directory's name); its id is kept in
  ``<run directory>/wandb_run.json``. A resumed fit and the ``validate``, ``test`` and
  ``predict`` of its checkpoints log into that run (by id, ``resume="allow"``); a
  checkpoint without such a record logs into a run of the group named after its directory.
  W&B files go under the output directory (``<dir>/wandb/offline-run-*`` offline), and each
  command finishes the run it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import string
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from jsonargparse import Namespace
from pytorch_lightning.loggers import WandbLogger

from ssl_rec._io import atomic_write_json
from ssl_rec.cli.checkpoint_args import option_value
from ssl_rec.cli.run_dir import is_global_rank_zero

OUTPUT_COMMANDS = ("validate", "test", "predict")
WANDB_RECORD = "wandb_run.json"
GROUP_ENV = "WANDB_RUN_GROUP"
OVERWRITE_HELP = (
    "Replace the results of an earlier run of this command in the output directory "
    "(metrics.json, <command>_config.yaml, the predictions file); without it they are kept "
    "and the command is refused."
)
_ID_CHARS = string.ascii_lowercase + string.digits


def checkpoint_run_dir(ckpt_path: str | os.PathLike[str]) -> Path:
    """The run directory of a checkpoint: where the commands that read it write.

    Args:
        ckpt_path: a checkpoint file or a sharded checkpoint directory.

    Returns:
        The parent of its ``checkpoints/`` directory when that holds a ``config.yaml`` (the
        fit's run), else the directory the checkpoint is in.

    """
    parent = Path(ckpt_path).parent
    if parent.name == "checkpoints" and (parent.parent / "config.yaml").is_file():
        return parent.parent
    return parent


def _checkpoint(config: Namespace) -> Path | None:
    ckpt = config.get("ckpt_path")
    return Path(str(ckpt)) if ckpt and Path(str(ckpt)).exists() else None


def place_outputs(subcommand: str | None, config: Namespace, argv: Sequence[str]) -> None:
    """Send a checkpoint command's outputs to the checkpoint's run and keep earlier results.

    Sets ``trainer.default_root_dir`` of ``validate`` / ``test`` / ``predict`` with a
    ``--ckpt_path`` to :func:`checkpoint_run_dir` unless the command line gives
    ``--trainer.default_root_dir``, then refuses to replace an earlier result there.

    Args:
        subcommand: the LightningCLI subcommand.
        config: its parsed config (``ckpt_path`` already resolved to a file).
        argv: the command line, subcommand first.

    Raises:
        FileExistsError: an output of this command exists and ``--overwrite`` is false.

    """
    if subcommand not in OUTPUT_COMMANDS:
        return
    ckpt = _checkpoint(config)
    if ckpt is not None and option_value(argv, "trainer.default_root_dir") is None:
        config.trainer.default_root_dir = str(checkpoint_run_dir(ckpt))
    if not config.get("overwrite"):
        existing = [path for path in command_outputs(subcommand, config) if path.exists()]
        if existing:
            raise FileExistsError(
                f"{existing[0]} already exists (an earlier `ssl-rec {subcommand}`); pass "
                "--overwrite true to replace it, or --trainer.default_root_dir DIR to write "
                "elsewhere"
            )


def command_outputs(subcommand: str, config: Namespace) -> list[Path]:
    """The files ``subcommand`` writes: its result file, if any, and its config record."""
    root = Path(config.trainer.default_root_dir or ".")
    files = []
    if subcommand == "test" and config.get("metrics_json"):
        files.append(root / str(config.metrics_json.filename))
    if subcommand == "predict":
        out = (config.get("predictions") or Namespace()).get("out")
        files.append(Path(str(out)) if out else root / "predictions.parquet")
    return [*files, root / f"{subcommand}_config.yaml"]


def _is_wandb(logger: Any) -> bool:
    return str(getattr(logger, "class_path", "")).endswith("WandbLogger")


def read_wandb_record(directory: Path) -> dict[str, Any] | None:
    """The W&B run a fit recorded in ``directory`` (``id``, ``project``, ``group``, ``name``)."""
    try:
        record = json.loads((directory / WANDB_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("id") else None


def set_wandb_run(subcommand: str | None, config: Namespace) -> None:
    """Fill the W&B logger's run id, group and name in; a ``fit`` records its run.

    Only settings the user left unset are filled. A ``fit`` gets a new id (a resumed fit
    the recorded one) and writes ``wandb_run.json`` into its run directory (first process
    only); other commands log into the run recorded beside their checkpoint.

    Args:
        subcommand: the LightningCLI subcommand (``None``: :func:`ssl_rec.cli.instantiate`).
        config: its parsed config, the logger already defaulted and ``save_dir`` set.

    """
    logger = config.trainer.get("logger")
    init = getattr(logger, "init_args", None)
    if not _is_wandb(logger) or init is None or subcommand is None:
        return
    root = Path(config.trainer.default_root_dir or ".")
    ckpt = _checkpoint(config)
    if subcommand == "fit":
        source, record = root, (read_wandb_record(root) if ckpt is not None else None)
    else:
        source = checkpoint_run_dir(ckpt) if ckpt is not None else root
        record = read_wandb_record(source)
    if init.get("id") is None and init.get("version") is None and record is not None:
        init.id, init.project, init.resume = record["id"], record.get("project"), "allow"
        _fill(init, group=record.get("group"), name=record.get("name"))
        return
    group = os.environ.get(GROUP_ENV) or source.absolute().name
    if subcommand != "fit":
        _fill(init, group=group, job_type=subcommand)
        return
    _fill(init, id=init.get("version") or _new_run_id(), group=group, name=root.absolute().name,
          job_type="fit")  # fmt: skip
    if is_global_rank_zero():
        fields = ("id", "project", "group", "name")
        atomic_write_json(root / WANDB_RECORD, {key: init.get(key) for key in fields})


def _fill(init: Namespace, **values: Any) -> None:
    for key, value in values.items():
        if init.get(key) is None:
            setattr(init, key, value)


def _new_run_id() -> str:
    """Eight lowercase letters and digits, as W&B makes its own run ids."""
    return "".join(secrets.choice(_ID_CHARS) for _ in range(8))


def drop_deprecated_wandb_settings(trainer: pl.Trainer) -> None:
    """Stop Lightning's ``WandbLogger`` passing ``anonymous=None`` to ``wandb.init``.

    wandb (0.19 and later) warns "The anonymous setting has no effect" for any value given,
    ``None`` included, on every command.
    """
    for logger in trainer.loggers:
        init = getattr(logger, "_wandb_init", None)
        if isinstance(logger, WandbLogger) and isinstance(init, dict):
            if init.get("anonymous") is None:
                init.pop("anonymous", None)


def finish_wandb_run(trainer: pl.Trainer | None, failed: bool) -> None:
    """Finish the W&B run a command started, so the next command in the process gets its own.

    Lightning leaves it open; a later ``WandbLogger`` in the same process (the demo, a
    script calling ``ssl_rec.cli.main`` twice) would log into it instead of its own run.
    """
    for logger in getattr(trainer, "loggers", None) or []:
        experiment = getattr(logger, "_experiment", None)
        if isinstance(logger, WandbLogger) and experiment is not None:
            finish = getattr(experiment, "finish", None)
            if callable(finish):
                finish(exit_code=1 if failed else 0)


@contextlib.contextmanager
def wandb_group(group: str) -> Iterator[str]:
    """Put the fits run inside the block into one W&B group (``$WANDB_RUN_GROUP``).

    A group already set in the environment is kept; the variable is restored afterwards.

    Yields:
        The group the runs join.

    """
    before = os.environ.get(GROUP_ENV)
    os.environ[GROUP_ENV] = before or group
    try:
        yield os.environ[GROUP_ENV]
    finally:
        if before is None:
            os.environ.pop(GROUP_ENV, None)
        else:
            os.environ[GROUP_ENV] = before
