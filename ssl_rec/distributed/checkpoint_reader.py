"""Reading a torch.distributed.checkpoint (DCP) directory without running code stored in it.

DCP's ``FileSystemReader.read_metadata`` unpickles ``.metadata`` with :mod:`pickle`, and its
``DefaultLoadPlanner.load_bytes`` reads every non-tensor value with ``torch.load(...,
weights_only=False)``: either runs whatever a crafted file names. Here ``.metadata`` goes
through an unpickler that resolves only DCP's metadata dataclasses and the few torch types
they hold (found by unpickling real ``.metadata`` files of this library's checkpoints), and
non-tensor values through torch's ``weights_only`` unpickler (plain data and tensors only).
Tensor blocks are read by DCP itself, already with ``weights_only=True``.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import ReadItem

METADATA_FILENAME = ".metadata"  # DCP's name for the pickled metadata file
_PATH_CLASSES = frozenset({"Path", "PosixPath", "PurePath", "PurePosixPath", "PureWindowsPath",
                           "WindowsPath"})  # fmt: skip
# module -> names the metadata unpickler resolves. ``_StorageInfo`` (the file, offset and
# length of an entry), ``_MEM_FORMAT_ENCODING`` and ``_get_layout`` (how TensorProperties
# pickles its memory format and layout) are private to torch: a test unpickles a real
# ``.metadata`` with this list, so a torch upgrade that renames them fails there first.
_ALLOWED_GLOBALS: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),  # maps "torch.strided" to the layout
    "torch": frozenset({"Size"}),  # and every torch.dtype by name, see find_class
    "pathlib": _PATH_CLASSES,  # StorageMeta.checkpoint_id, the directory DCP wrote to
    "pathlib._local": _PATH_CLASSES,  # where Python 3.13 defines them
}
_MAX_LIST_INDEX = 1 << 20  # a key path's list position; rebuilding a list allocates up to it
# Names DCP gives its data files (``__0_0.distcp``): plain names in the directory.
DATA_FILE_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")

__all__ = [
    "DATA_FILE_PATTERN",
    "METADATA_FILENAME",
    "CheckpointRefused",
    "SafeFileSystemReader",
    "SafeLoadPlanner",
    "read_checkpoint_metadata",
]


class CheckpointRefused(ValueError):
    """A checkpoint directory that is not what this library writes, or that asks to run code."""


class _MetadataUnpickler(pickle.Unpickler):
    """A :class:`pickle.Unpickler` that resolves only DCP's metadata classes (see module doc)."""

    def __init__(self, file: io.BufferedIOBase, where: str) -> None:
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        """Resolve ``module.name`` if it is on the allow-list, else refuse the file."""
        if name in _ALLOWED_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CheckpointRefused(
            f"{self.where}: refused to unpickle {module}.{name}; a checkpoint's metadata "
            "holds only torch.distributed.checkpoint's metadata classes (a crafted file?)"
        )

    def persistent_load(self, pid: Any) -> Any:
        """DCP metadata has no persistent ids; one means the file was made by something else."""
        raise CheckpointRefused(f"{self.where}: refused a persistent id in the metadata")


def _key_path_ok(path: Any) -> bool:
    return (
        isinstance(path, tuple)
        and len(path) > 0
        and all(type(p) is str or (type(p) is int and 0 <= p < _MAX_LIST_INDEX) for p in path)
    )


def _tensor_bytes(fqn: Any, entry: Any) -> int:
    """Bytes a tensor entry declares (0 for a value); raise if the entry is malformed."""
    if not isinstance(fqn, str):
        raise TypeError(fqn)
    if isinstance(entry, BytesStorageMetadata):
        return 0
    if not isinstance(entry, TensorStorageMetadata):
        raise TypeError(entry)
    size, dtype = tuple(entry.size), entry.properties.dtype
    if not isinstance(dtype, torch.dtype) or not all(type(n) is int and n >= 0 for n in size):
        raise TypeError(entry)
    return math.prod(size) * dtype.itemsize


def _check_metadata(metadata: Any, where: str, data_files: Mapping[str, int] | None) -> Metadata:
    if not isinstance(metadata, Metadata):
        raise CheckpointRefused(f"{where}: holds a {type(metadata).__name__}, not DCP metadata")
    entries, storage = metadata.state_dict_metadata, metadata.storage_data
    planner_data = metadata.planner_data if metadata.planner_data is not None else {}
    if not all(isinstance(x, dict) for x in (entries, storage, planner_data)):
        raise CheckpointRefused(f"{where}: malformed DCP metadata")
    tensor_bytes = 0
    for fqn, entry in entries.items():
        try:
            tensor_bytes += _tensor_bytes(fqn, entry)
        except (AttributeError, TypeError):
            raise CheckpointRefused(f"{where}: malformed entry {fqn!r}") from None
    for fqn, path in planner_data.items():
        if not _key_path_ok(path):
            raise CheckpointRefused(f"{where}: malformed key path for {fqn!r}")
    for info in storage.values():
        name = getattr(info, "relative_path", None)
        # Entries name files of this directory only, never a path elsewhere.
        if not isinstance(name, str) or not DATA_FILE_PATTERN.fullmatch(name):
            raise CheckpointRefused(f"{where}: names a data file outside its directory: {name!r}")
        if data_files is not None and name not in data_files:
            raise CheckpointRefused(f"{where}: names {name!r}, not a file of the checkpoint")
        if not all(type(getattr(info, k, None)) is int for k in ("offset", "length")):
            raise CheckpointRefused(f"{where}: malformed storage entry for {name!r}")
    # Tensors are stored uncompressed, so their declared sizes cannot exceed the files': a
    # crafted size would otherwise allocate without bound before any data is read.
    if data_files is not None and tensor_bytes > sum(data_files.values()):
        raise CheckpointRefused(f"{where}: declares more tensor bytes than its files hold")
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    return metadata


def read_checkpoint_metadata(
    directory: str | os.PathLike[str], data_files: Mapping[str, int] | None = None
) -> Metadata:
    """Unpickle a DCP directory's ``.metadata`` through the allow-list unpickler.

    Args:
        directory: The checkpoint directory.
        data_files: The data files the metadata may name, with their sizes in bytes (which
            bound the tensor bytes it may declare); ``None`` only checks that it names
            plain file names.

    Returns:
        DCP's :class:`~torch.distributed.checkpoint.metadata.Metadata`.

    Raises:
        CheckpointRefused: naming the file, when it holds anything but DCP metadata.

    """
    path = Path(directory) / METADATA_FILENAME
    with open(path, "rb") as f:
        try:
            metadata = _MetadataUnpickler(f, str(path)).load()
        except CheckpointRefused:
            raise
        except Exception as e:  # noqa: BLE001 - a corrupt pickle raises many types
            raise CheckpointRefused(f"{path}: not readable DCP metadata ({e})") from None
    return _check_metadata(metadata, str(path), data_files)


class SafeFileSystemReader(FileSystemReader):
    """DCP's ``FileSystemReader`` whose metadata is read by :func:`read_checkpoint_metadata`.

    Args:
        path: The checkpoint directory.
        data_files: The data files the metadata may name, with their sizes in bytes (see
            :func:`read_checkpoint_metadata`).

    """

    def __init__(
        self, path: str | os.PathLike[str], data_files: Mapping[str, int] | None = None
    ) -> None:
        super().__init__(path)
        self.directory = Path(path)
        self.data_files = data_files
        self._metadata: Metadata | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The directory's metadata (read once, through the allow-list unpickler)."""
        if kwargs.get("rank") is not None:  # DCP's per-rank fallback: never written here
            raise CheckpointRefused(f"{self.directory}: no per-rank metadata in this checkpoint")
        if self._metadata is None:
            self._metadata = read_checkpoint_metadata(self.directory, self.data_files)
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading non-tensor values as plain data only.

    Values are unpickled with ``torch.load(..., weights_only=True)`` and collected in
    :attr:`loaded_bytes` (flattened key -> value) instead of being set into the state dict.

    Args:
        where: The checkpoint, for messages.

    """

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where
        self.loaded_bytes: dict[str, Any] = {}

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """Unpickle one non-tensor value with torch's ``weights_only`` unpickler."""
        fqn = read_item.dest_index.fqn
        try:
            self.loaded_bytes[fqn] = torch.load(value, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - the unpickler raises many types
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckpointRefused(
                f"{self.where}: entry {fqn} is not plain data, refused ({reason})"
            ) from None
