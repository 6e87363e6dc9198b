"""Sharded checkpoint directories load in a single-process trainer, as the file would.

A ``ShardedTablesStrategy`` run writes each checkpoint as a torch.distributed.checkpoint
directory. In one process (``ssl-rec test|predict|validate --ckpt_path DIR``, ``fit
--ckpt_path DIR`` without the strategy) Lightning hands that path to its ``CheckpointIO``,
which reads files. :class:`ShardedCheckpointReader` wraps whatever ``CheckpointIO`` the
trainer has and reads directories with :func:`ssl_rec.lightning.checkpoint_loading.read_checkpoint`
(manifest checked, nothing unpickled but plain data, full tables); every other call goes to
the wrapped one. A single-process run that resumed a sharded one replaces a checkpoint
directory (``last.ckpt``) by its file in one swap, so the directory stays until the file is
complete. ``ssl-rec`` installs it on every trainer it builds (:func:`read_sharded_checkpoints`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from lightning_fabric.plugins import CheckpointIO

from ssl_rec.distributed.dcp_checkpoint import remove_checkpoint_path, staging_path, swap_into_place
from ssl_rec.lightning.checkpoint_loading import read_checkpoint

__all__ = ["ShardedCheckpointReader", "read_sharded_checkpoints"]


class ShardedCheckpointReader(CheckpointIO):
    """A ``CheckpointIO`` that reads sharded checkpoint directories, delegating the rest.

    Args:
        inner: The ``CheckpointIO`` that writes, removes, and reads checkpoint files.

    """

    def __init__(self, inner: CheckpointIO) -> None:
        super().__init__()
        self.inner = inner

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Write with the wrapped ``CheckpointIO``; a directory at ``path`` is swapped out."""
        if not (isinstance(path, str | os.PathLike) and os.path.isdir(path)):
            self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
            return
        staging = staging_path(path)
        remove_checkpoint_path(staging)  # left by a save that was killed
        self.inner.save_checkpoint(checkpoint, staging, storage_options=storage_options)
        swap_into_place(staging, Path(path))

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """A sharded checkpoint directory as one dict (full tables); files as the wrapped IO."""
        if isinstance(path, str | os.PathLike) and os.path.isdir(path):
            return read_checkpoint(path)
        return self.inner.load_checkpoint(path, *args, **kwargs)

    def remove_checkpoint(self, path: Any) -> None:
        """Remove with the wrapped ``CheckpointIO`` (directories included)."""
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        """Tear the wrapped ``CheckpointIO`` down."""
        self.inner.teardown()


def read_sharded_checkpoints(trainer: pl.Trainer) -> None:
    """Let ``trainer`` load sharded checkpoint directories (wraps its ``CheckpointIO`` once)."""
    strategy = trainer.strategy
    if not isinstance(strategy.checkpoint_io, ShardedCheckpointReader):
        strategy.checkpoint_io = ShardedCheckpointReader(strategy.checkpoint_io)
