"""Process-wide defaults of the command line: offline services, the library's log, less noise."""

from __future__ import annotations

import logging
import os
import sys
import warnings

from ssl_rec.hardware.freed_memory import keep_freed_memory

# Dependency messages every run would print that say nothing about the user's run.
_NOISY_WARNINGS = (
    # Lightning 2.6 on torch 2.13, once per fit (see STACK notes).
    (r"`?isinstance\(treespec, LeafSpec\)`? is deprecated", FutureWarning),
    # The batch loaders read memory-mapped Arrow in-process; DataLoader workers do not apply.
    (r".*does not have many workers.*", UserWarning),
    # Said on every resume: fit refuses a directory holding another run's checkpoints
    # (ssl_rec.cli.run_dir), so a non-empty one is this run's own.
    (r"Checkpoint directory .* exists and is not empty", UserWarning),
    # validate/test/predict from a checkpoint: the fit's callbacks have nothing to restore
    # there (a fit always builds its config's callbacks).
    (r"Be aware that when using `ckpt_path`, callbacks used to create", UserWarning),
    # A checkpoint command without --config; "Seed set to 0" follows anyway.
    (r"No seed found, seed set to", UserWarning),
)
_NOISY_LOG_PREFIXES = ("💡 Tip:", "TPU available:", "GPU available: False")


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at each record (it may be replaced later)."""

    @property
    def stream(self) -> object:  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(_NOISY_LOG_PREFIXES)


def configure_environment() -> None:
    """Offline W&B and hubs by default, freed memory kept, ``ssl_rec`` logs on stderr, no noise.

    W&B runs offline unless an API key is configured; HuggingFace hubs are never contacted.
    Idempotent: the handler and filters are installed once per process.
    """
    if not os.environ.get("WANDB_API_KEY"):
        os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    keep_freed_memory()  # no page faults for each step's fresh outputs and gradients
    for message, category in _NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message, category)
    for name in ("pytorch_lightning.utilities.rank_zero", "lightning_fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in logger.filters):
            logger.addFilter(_DropNoise())
    library = logging.getLogger("ssl_rec")
    if not library.handlers:
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        library.addHandler(handler)
        library.setLevel(logging.INFO)


def wandb_offline() -> bool:
    """Whether W&B should run offline (the default unless an API key is configured)."""
    return os.environ.get("WANDB_MODE", "offline") in ("offline", "disabled")
