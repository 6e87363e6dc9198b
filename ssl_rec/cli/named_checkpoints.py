"""``--ckpt_path last`` and ``--ckpt_path best``: files of the run directory, or one clear line.

- ``last`` is ``<checkpoints>/last.ckpt``: where the run stands, the one ``fit`` resumes
  (written every few minutes of training, at every epoch's end and on Ctrl-C by
  :class:`ssl_rec.lightning.resume_checkpoint.ResumeCheckpoint`).
- ``best`` is ``<checkpoints>/best.ckpt``: the checkpoint of the best validation AUC the shipped
  CTR configs keep (``configs/common/callbacks/best_val_auc.yaml``), the model to test,
  export and serve.

``<checkpoints>`` is each checkpoint callback's ``dirpath``, by default
``<default_root_dir>/checkpoints``. Lightning itself resolves ``best`` only in the process
that ran the fit, and answers ``last`` without a file by training from scratch after a
warning; here both name a file or fail in one line.
"""

from __future__ import annotations

from pathlib import Path

from jsonargparse import Namespace

from ssl_rec.cli.run_dir import is_checkpoint_callback

NAMED_CHECKPOINTS = {"last": "last.ckpt", "best": "best.ckpt"}


def run_checkpoint_dirs(config: Namespace) -> list[Path]:
    """Where a subcommand's config keeps checkpoints: callbacks' ``dirpath`` or the default."""
    root = Path(config.trainer.default_root_dir or ".")
    dirs = []
    for callback in config.trainer.get("callbacks") or []:
        if is_checkpoint_callback(callback):
            dirpath = (getattr(callback, "init_args", None) or {}).get("dirpath")
            dirs.append(Path(dirpath) if dirpath else root / "checkpoints")
    return list(dict.fromkeys(dirs)) or [root / "checkpoints"]


def resolve_named_checkpoint(config: Namespace, subcommand: str) -> None:
    """Replace ``ckpt_path: last|best`` in a subcommand's config by the file it names.

    A file (or a sharded checkpoint directory) of that name in the first checkpoint
    directory holding one; other values are left as they are.

    Raises:
        ValueError: no such file; one line naming the directory and what to do instead.

    """
    name = config.get("ckpt_path")
    if not isinstance(name, str) or name not in NAMED_CHECKPOINTS:
        return
    filename = NAMED_CHECKPOINTS[name]
    dirs = run_checkpoint_dirs(config)
    for directory in dirs:
        if (directory / filename).exists():
            config.ckpt_path = str(directory / filename)
            return
    raise ValueError(_missing(filename, dirs[0], subcommand))


def _missing(filename: str, directory: Path, subcommand: str) -> str:
    others = sorted(p.name for p in directory.glob("*.ckpt")) if directory.is_dir() else []
    if filename == "last.ckpt" and subcommand == "fit":
        if not others:
            return (
                f"no last.ckpt in {directory}: the run saved none yet; start it again "
                "without --ckpt_path"
            )
        return f"no last.ckpt in {directory}; resume one of {others} with --ckpt_path FILE"
    if filename == "best.ckpt":
        why = "best.ckpt is written at the end of an epoch with validation"
        if "last.ckpt" in others:
            return f"no best.ckpt in {directory} ({why}); the last state is {directory}/last.ckpt"
        return f"no best.ckpt in {directory} ({why}); give a checkpoint file with --ckpt_path"
    found = f"; it holds {others}" if others else ": the run saved none yet"
    return f"no {filename} in {directory}{found}"


_NAMED_HELP = (
    "best: <checkpoints>/best.ckpt, the checkpoint of the best validation AUC (the model to "
    "test, export and serve); last: <checkpoints>/last.ckpt, where training stopped; "
    "<checkpoints> is <default_root_dir>/checkpoints of the fit's config"
)
# The --ckpt_path help of each LightningCLI subcommand.
CKPT_PATH_HELP = {
    "fit": (
        "Resume a stopped fit: last (<default_root_dir>/checkpoints/last.ckpt, written every "
        "few minutes of training, at every epoch's end and on Ctrl-C; the run continues from "
        "the step it holds) or a checkpoint file."
    ),
    "validate": f"The checkpoint to validate: a file, or {_NAMED_HELP}.",
    "test": f"The checkpoint to test: a file, or {_NAMED_HELP}.",
    "predict": (
        f"The checkpoint (or quantized model directory) to predict with: a file, or {_NAMED_HELP}."
    ),
}
