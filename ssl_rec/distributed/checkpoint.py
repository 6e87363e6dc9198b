"""Checkpoints of sharded runs with torch.distributed.checkpoint (DCP): a directory per save.

Every rank writes its blocks of the sharded tables (``ShardedTensor`` values of the model's
``state_dict``, see :mod:`~ssl_rec.distributed.state`); replicated values (dense weights,
optimizer states, loops) are written once. A save on W ranks loads on any number of ranks,
sharded differently, or in one process without a process group, where it reads as the
checkpoint one process would have written (full tables, same keys). No TorchRec import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

MODEL_KEY = "state_dict"

__all__ = [
    "is_distributed_checkpoint",
    "load_distributed_checkpoint",
    "read_distributed_checkpoint",
    "save_distributed_checkpoint",
]


def is_distributed_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a DCP checkpoint directory (holds DCP's ``.metadata``)."""
    return (Path(path) / ".metadata").is_file()


def save_distributed_checkpoint(
    checkpoint: Mapping[str, Any],
    path: str | os.PathLike[str],
    group: dist.ProcessGroup | None = None,
) -> None:
    """Collective: write ``checkpoint`` (a Lightning checkpoint dict) to directory ``path``."""
    Path(path).mkdir(parents=True, exist_ok=True)
    dcp.save(dict(checkpoint), checkpoint_id=str(path), process_group=group)


def _top_level_keys(path: Path) -> set[str]:
    metadata = FileSystemReader(str(path)).read_metadata()
    return {str(keys[0]) for keys in metadata.planner_data.values()}


def read_distributed_checkpoint(
    path: str | os.PathLike[str], keys: set[str] | None = None
) -> dict[str, Any]:
    """Read a DCP checkpoint whole, in this process (no process group), as plain tensors.

    Args:
        path: The checkpoint directory.
        keys: Read only these entries (dotted paths, e.g. ``epoch`` or
            ``state_dict.head.weight``; a key selects everything below it). Default: all.

    Returns:
        The nested checkpoint dict; sharded tables come back as full tensors.

    Raises:
        FileNotFoundError: ``path`` is not a DCP checkpoint directory.

    """
    path = Path(path)
    if not is_distributed_checkpoint(path):
        raise FileNotFoundError(f"not a torch.distributed.checkpoint directory: {path}")
    checkpoint: dict[str, Any] = {}
    if keys is None or keys:  # DCP's own reader of whole checkpoints (Lightning's as well)
        _load_state_dict(checkpoint, storage_reader=FileSystemReader(str(path)),
                         planner=_EmptyStateDictLoadPlanner(keys=keys), no_dist=True)  # fmt: skip
    return checkpoint


def load_distributed_checkpoint(
    path: str | os.PathLike[str],
    model_state: dict[str, Any],
    group: dist.ProcessGroup | None = None,
) -> dict[str, Any]:
    """Collective: load a DCP checkpoint, the model sharded into ``model_state``'s layout.

    Args:
        path: The checkpoint directory.
        model_state: The current ``module.state_dict()``; its tensors (``ShardedTensor``
            blocks included) are filled in place, resharded from the saved layout.
        group: Process group.

    Returns:
        The checkpoint dict whose ``state_dict`` is ``model_state`` with the saved values
        (non-tensor entries such as tables' formats are read as saved).

    """
    if not is_distributed_checkpoint(path):
        raise FileNotFoundError(f"not a torch.distributed.checkpoint directory: {path}")
    tensors = {k: v for k, v in model_state.items() if isinstance(v, torch.Tensor)}
    dcp.load({MODEL_KEY: tensors}, checkpoint_id=str(path), process_group=group)
    others = {f"{MODEL_KEY}.{k}" for k in model_state if k not in tensors}
    keys = (_top_level_keys(Path(path)) - {MODEL_KEY}) | others
    checkpoint = read_distributed_checkpoint(path, keys)
    checkpoint[MODEL_KEY] = {**checkpoint.get(MODEL_KEY, {}), **tensors}
    return checkpoint
