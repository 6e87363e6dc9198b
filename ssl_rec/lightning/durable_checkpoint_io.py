"""``DurableCheckpointIO``: checkpoint files that are complete at their final name, or absent.

Lightning's ``TorchCheckpointIO`` writes through an fsspec transaction whose local file
stages the bytes in ``tempfile.mkstemp()`` (under ``$TMPDIR``) and ``shutil.move`` s it over
the final name at commit: when ``$TMPDIR`` is another filesystem the move is a copy into
the final name, so a kill during it leaves a truncated ``last.ckpt``, and the staging file of
a killed writer stays in ``$TMPDIR`` for ever; nothing is fsynced. This plugin writes with
:func:`ssl_rec._io.atomic_write_bytes` instead: a temporary file in the destination directory,
fsynced, renamed over the final name, the directory fsynced. It also

- records per-tensor checksums (:mod:`ssl_rec.lightning.checkpoint_checksums`) in every
  checkpoint and verifies them when Lightning loads one (``fit --ckpt_path``);
- removes checkpoint temporaries of dead writers from a directory before its first write;
- turns a failed write (disk full, read-only filesystem) into one line naming the directory
  and the bytes needed, with no file left under the final name.

``ssl-rec`` uses it by default (``trainer.plugins``); from Python pass
``pl.Trainer(plugins=[DurableCheckpointIO()])``.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning_fabric.utilities.cloud_io import _is_local_file_protocol
from lightning_fabric.utilities.types import _PATH

from ssl_rec._io import atomic_write_bytes, remove_stale_temporaries
from ssl_rec.lightning.checkpoint_checksums import record_checksums, verify_checksums

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_CHECKPOINT_SUFFIX = ".ckpt"


class CheckpointSaveError(ValueError):
    """A checkpoint could not be written (disk full, read-only or missing directory, I/O error)."""


def _megabytes(n: int) -> str:
    return f"{max(1, round(n / 1e6))} MB"


def save_failure(directory: Path, needed: int, error: OSError) -> CheckpointSaveError:
    """The one-line error for a failed save of ``needed`` bytes into ``directory``.

    Example: ``cannot save checkpoint to runs/x/checkpoints: no space left on device (needs
    69 MB, 12 MB free)``.
    """
    # os.strerror, not error.strerror: ssl_rec._io's DiskFullError carries a whole sentence there
    reason = os.strerror(error.errno) if error.errno else str(error) or type(error).__name__
    reason = reason.lower()
    detail = ""
    if error.errno in _NO_SPACE:
        detail = f" (needs {_megabytes(needed)}"
        try:
            detail += f", {_megabytes(shutil.disk_usage(directory).free)} free)"
        except OSError:
            detail += ")"
    return CheckpointSaveError(f"cannot save checkpoint to {directory}: {reason}{detail}")


def remove_stale_checkpoint_temporaries(directory: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporaries of checkpoint files left in ``directory`` by dead writers.

    A temporary of ``NAME.ckpt`` is ``.NAME.ckpt.<pid>.<random>.tmp``
    (:func:`ssl_rec._io.atomic_write_bytes`); one whose process still runs is kept.

    Returns:
        The removed paths.

    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    names = set()
    for entry in directory.iterdir():
        parts = entry.name.rsplit(".", 3)
        if entry.name.startswith(".") and len(parts) == 4 and parts[3] == "tmp":
            name = parts[0][1:]
            if name.endswith(_CHECKPOINT_SUFFIX) and parts[1].isdigit():
                names.add(name)
    return [
        removed for name in sorted(names) for removed in remove_stale_temporaries(directory / name)
    ]


def _keep_location(storage: Any, location: str) -> Any:
    return storage  # Lightning's default map_location: tensors stay where they were saved


class DurableCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` with atomic, fsynced local writes and per-tensor checksums.

    Remote paths (``s3://``, ...) go to Lightning's writer unchanged (an object store's put is
    atomic by itself); checksums are recorded for them too.
    """

    def __init__(self) -> None:
        super().__init__()
        self._cleaned: set[Path] = set()

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None
    ) -> None:
        """Write ``checkpoint`` to ``path`` atomically, with its checksums.

        Raises:
            CheckpointSaveError: the write failed; ``path`` is as it was before.
            TypeError: ``storage_options`` given (as Lightning's writer).

        """
        record_checksums(checkpoint)
        if not _is_local_file_protocol(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = Path(path)
        directory = path.parent
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        size = buffer.tell()
        try:
            directory.mkdir(parents=True, exist_ok=True)
            if directory not in self._cleaned:
                remove_stale_checkpoint_temporaries(directory)
                self._cleaned.add(directory)
            with buffer.getbuffer() as data:
                atomic_write_bytes(path, data)
        except OSError as e:
            raise save_failure(directory, size, e) from e

    def load_checkpoint(
        self, path: _PATH, map_location: Any = _keep_location, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Load with Lightning's reader, then verify the recorded checksums.

        Raises:
            ssl_rec._io.ChecksumError: a tensor differs from its recorded checksum.

        """
        checkpoint = super().load_checkpoint(
            path, map_location=map_location, weights_only=weights_only
        )
        if isinstance(checkpoint, dict):
            verify_checksums(checkpoint, str(path))
        return checkpoint
