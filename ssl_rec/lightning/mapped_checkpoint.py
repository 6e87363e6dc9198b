"""Checkpoint files whose embedding tables stay in the file: read-only views, no process memory.

``torch.load`` reads every tensor of a file into the process's memory, and its ``mmap=True``
maps the file copy-on-write (a private writable mapping, which the kernel counts as the
process's data: ``RLIMIT_DATA``, ``VmData``). :func:`map_checkpoint_file` maps the file
read-only and shared instead: the tables' tensors (``*.group.tables.<i>.{store, momentum,
cache.rows, cache.tags, cache.state}`` under ``state_dict``) are views of the page cache,
read when a shard copies its rows, never anonymous memory. Every other tensor (dense
weights, optimizer states, random states, vocabularies) is copied into ordinary memory, so
the code that trains with it may write to it; writing to a table's view faults (the file
is never changed). The unpickler is ``weights_only``, as ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import mmap
import os
import re
import warnings
from typing import Any

import torch
from torch import nn

__all__ = ["is_table_key", "map_checkpoint_file"]

# The tensors of a MixedPrecisionEmbeddingCollection's state that hold one value per row or set.
_TABLE_KEY = re.compile(
    r"(?:^|\.)group\.tables\.\d+\.(?:store|momentum|cache\.(?:rows|tags|state))$"
)
_MODEL_KEY = "state_dict"


def is_table_key(key: str) -> bool:
    """Whether state-dict ``key`` names a table's rows or cache sets (kept mapped)."""
    return _TABLE_KEY.search(key) is not None


def _load_mapped(path: str) -> Any:
    """The checkpoint with every tensor a view of a read-only shared mapping of ``path``."""
    with open(path, "rb") as file:
        mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    with warnings.catch_warnings():  # "The given buffer is not writable": it must not be
        warnings.simplefilter("ignore", UserWarning)
        storage = torch.frombuffer(mapping, dtype=torch.uint8).untyped_storage()
    # torch.load(mmap=True) with this mapping in place of its copy-on-write one.
    with torch.serialization._open_zipfile_reader(path) as archive:
        return torch.serialization._load(
            archive, "cpu", torch._weights_only_unpickler, overall_storage=storage
        )


def _writable(tensor: torch.Tensor, copies: dict[int, torch.UntypedStorage]) -> torch.Tensor:
    """``tensor`` in ordinary memory; tensors that shared a storage still share one."""
    source = tensor.untyped_storage()
    storage = copies.get(source.data_ptr())
    if storage is None:
        storage = copies[source.data_ptr()] = source.clone()
    copy = torch.empty(0, dtype=tensor.dtype).set_(
        storage, tensor.storage_offset(), tensor.size(), tensor.stride()
    )
    if isinstance(tensor, nn.Parameter):
        return nn.Parameter(copy, requires_grad=tensor.requires_grad)
    return copy


def _copy_all_but_tables(obj: Any, path: tuple[Any, ...], copies: dict) -> Any:
    if isinstance(obj, torch.Tensor):
        table = len(path) == 2 and path[0] == _MODEL_KEY and is_table_key(str(path[1]))
        return obj if table else _writable(obj, copies)
    if isinstance(obj, dict):
        for key, value in obj.items():
            obj[key] = _copy_all_but_tables(value, (*path, key), copies)
        return obj
    if isinstance(obj, list):
        obj[:] = [_copy_all_but_tables(v, (*path, i), copies) for i, v in enumerate(obj)]
        return obj
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_copy_all_but_tables(v, (*path, i), copies) for i, v in enumerate(obj))
    return obj


def map_checkpoint_file(path: str | os.PathLike[str], writable: bool = True) -> Any:
    """Load checkpoint file ``path`` with its tables left in the file (see the module docstring).

    A file in torch's legacy (non-zip) format has no layout to map: it is loaded whole.

    Args:
        path: The checkpoint file.
        writable: Copy every tensor but the tables into memory; ``False`` leaves them all
            read-only views (to read configs only).

    Raises:
        Whatever ``torch.load`` raises for a missing, empty, corrupt or unsafe file.

    """
    path = os.fspath(path)
    with open(path, "rb") as file:
        mappable = torch.serialization._is_zipfile(file)
    if not mappable:
        return torch.load(path, map_location="cpu", weights_only=True)
    checkpoint = _load_mapped(path)
    return _copy_all_but_tables(checkpoint, (), {}) if writable else checkpoint
