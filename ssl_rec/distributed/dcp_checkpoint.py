"""Checkpoints of sharded runs with torch.distributed.checkpoint (DCP): a directory per save.

Every rank writes its blocks of the sharded tables (``ShardedTensor`` values of the model's
``state_dict``, see :mod:`~ssl_rec.distributed.state`); replicated values (dense weights,
optimizer states, loops) are written once. A save on W ranks loads on any number of ranks,
sharded differently, or in one process without a process group, where it reads as the
checkpoint one process would have written (full tables, same keys, integer keys of
optimizer states). No TorchRec import.

A save is durable: the ranks write a staging directory ``.<name>.partial`` beside the
target; after DCP's save completed, rank 0 writes the manifest
(:mod:`~ssl_rec.distributed.checkpoint_manifest`) and swaps the staging directory into
place (one ``renameat2(RENAME_EXCHANGE)`` on Linux), so a kill or an error during a save
leaves the previous checkpoint under its name and never a partial one. A read checks the
manifest (files, sizes, SHA-256) before it opens DCP's metadata, and unpickles nothing but
plain data (:mod:`~ssl_rec.distributed.checkpoint_reader`).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import shutil
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from ssl_rec._io import fsync_directory
from ssl_rec.distributed.checkpoint_manifest import (
    CHECKPOINT_MANIFEST,
    KeyPath,
    data_file_sizes,
    dict_structure,
    restore_structure,
    verify_checkpoint_manifest,
    write_checkpoint_manifest,
)
from ssl_rec.distributed.checkpoint_reader import (
    CheckpointRefused,
    SafeFileSystemReader,
    SafeLoadPlanner,
)

MODEL_KEY = "state_dict"
STAGING_SUFFIX = ".partial"
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2
log = logging.getLogger(__name__)

__all__ = [
    "CheckpointRefused",
    "is_distributed_checkpoint",
    "load_distributed_checkpoint",
    "read_distributed_checkpoint",
    "remove_checkpoint_path",
    "remove_stale_staging",
    "save_distributed_checkpoint",
    "staging_path",
    "swap_into_place",
]


def is_distributed_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory holding this library's checkpoint manifest.

    Nothing is read: :func:`read_distributed_checkpoint` checks the directory against it.
    """
    return (Path(path) / CHECKPOINT_MANIFEST).is_file()


def _rank(group: dist.ProcessGroup | None) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _agree(error: Exception | None, group: dist.ProcessGroup | None) -> None:
    """Rank 0's outcome on every rank: its error is raised everywhere (also a barrier).

    A refusal stays a :class:`CheckpointRefused`; anything else becomes an ``OSError`` with
    the original errno (so a full disk is still reported as one).
    """
    outcome = None
    if error is not None:
        message = getattr(error, "strerror", None) or str(error)
        outcome = (isinstance(error, ValueError), getattr(error, "errno", None), message)
    if _rank(group)[1] > 1:
        box = [outcome]
        source = dist.get_global_rank(group, 0) if group is not None else 0
        dist.broadcast_object_list(box, src=source, group=group)
        outcome = box[0]
    if outcome is not None:
        refused, code, message = outcome
        if refused:
            raise CheckpointRefused(message)
        raise _os_error(code, message)


def _os_error(code: int | None, message: str) -> OSError:
    return OSError(code, message) if code is not None else OSError(message)


def _first_failure(error: CheckpointException) -> BaseException:
    for failure in error.failures.values():
        return failure[0] if isinstance(failure, tuple) else failure
    return error


def remove_checkpoint_path(path: Path) -> None:
    """Delete a checkpoint file or directory (nothing if absent; a link, not its target)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _rename_exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2``); ``False`` where unsupported."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]  # fmt: skip
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def swap_into_place(staging: Path, final: Path) -> None:
    """Make the complete directory ``staging`` appear as ``final``, replacing what was there.

    With ``renameat2(RENAME_EXCHANGE)`` ``final`` names the old or the new checkpoint at every
    instant; elsewhere the old one is renamed aside first (a kill between the two renames
    leaves it as ``.<name>.old``).
    """
    fsync_directory(staging)
    if not os.path.lexists(final):
        os.rename(staging, final)
    elif _rename_exchange(staging, final):
        remove_checkpoint_path(staging)  # now the previous checkpoint
    else:
        old = final.with_name(f".{final.name}.old")
        remove_checkpoint_path(old)
        os.rename(final, old)
        os.rename(staging, final)
        remove_checkpoint_path(old)
    fsync_directory(final.parent)


def staging_path(path: str | os.PathLike[str]) -> Path:
    """Where the ranks write a checkpoint of ``path`` before it is swapped into place."""
    path = Path(path)
    return path.with_name(f".{path.name}{STAGING_SUFFIX}")


def remove_stale_staging(directory: str | os.PathLike[str], suffix: str = ".ckpt") -> list[Path]:
    """Delete what killed saves left in ``directory``: ``.<name><suffix>.partial`` and ``.old``.

    Call it before a run's first save (nothing may be saving there). A kill leaves them
    beside a checkpoint that stayed whole; the next save of the same name would remove
    them, but a step checkpoint's name is not saved again.

    Returns:
        The removed paths.

    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    ends = (f"{suffix}{STAGING_SUFFIX}", f"{suffix}.old")
    stale = [
        e for e in sorted(directory.iterdir()) if e.name.startswith(".") and e.name.endswith(ends)
    ]
    for entry in stale:
        remove_checkpoint_path(entry)
        log.warning("removed %s, left by an interrupted checkpoint save", entry)
    return stale


def save_distributed_checkpoint(
    checkpoint: Mapping[str, Any],
    path: str | os.PathLike[str],
    group: dist.ProcessGroup | None = None,
) -> None:
    """Collective: write ``checkpoint`` (a Lightning checkpoint dict) as directory ``path``.

    The ranks write ``.<name>.partial``; once DCP's save completed on every rank, rank 0
    adds the manifest and swaps the directory into place, then every rank returns (or
    raises rank 0's error). If anything fails, ``path`` keeps what it held before.

    Args:
        checkpoint: The dict to save (``ShardedTensor`` blocks in its ``state_dict``).
        path: The checkpoint directory.
        group: Process group (default: the world); also works without one (one process).

    """
    final, staging = Path(path), staging_path(path)
    rank, world = _rank(group)
    error: Exception | None = None
    if rank == 0:
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            remove_checkpoint_path(staging)  # left by a save that was killed
            remove_checkpoint_path(final.with_name(f".{final.name}.old"))
            staging.mkdir()
        except OSError as e:
            error = _os_error(e.errno, f"{staging}: {e.strerror or e}")
    _agree(error, group)
    try:
        with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.save(dict(checkpoint), storage_writer=FileSystemWriter(staging),
                     process_group=group)  # fmt: skip
    except CheckpointException as e:
        if rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
        raise _first_failure(e) from None
    except BaseException:
        if rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    if rank == 0:
        try:
            write_checkpoint_manifest(staging, world, dict_structure(checkpoint))
            swap_into_place(staging, final)
        except Exception as e:  # noqa: BLE001 - every rank must learn of it, not only rank 0
            shutil.rmtree(staging, ignore_errors=True)
            reason = getattr(e, "strerror", None) or str(e)
            error = _os_error(getattr(e, "errno", None), f"{final}: not saved ({reason})")
    _agree(error, group)


def _selector(keys: set[str] | None) -> Callable[[KeyPath], bool]:
    """Whether an entry's key path is read when ``keys`` are asked for (a key selects below)."""

    def selected(path: KeyPath) -> bool:
        if keys is None:
            return True
        dotted = ""
        for part in path:
            dotted = f"{dotted}.{part}" if dotted else str(part)
            if dotted in keys:
                return True
        return False

    return selected


def _place(root: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    node: Any = root
    for key, following in zip(path[:-1], path[1:], strict=True):
        empty: Any = [] if type(following) is int else {}
        if isinstance(node, list):
            node.extend([None] * (key + 1 - len(node)))
            node[key] = empty if node[key] is None else node[key]
            node = node[key]
        else:
            node = node.setdefault(key, empty)
    if isinstance(node, list):
        node.extend([None] * (path[-1] + 1 - len(node)))
    node[path[-1]] = value


def _read(path: Path, manifest: Mapping[str, Any], keys: set[str] | None) -> dict[str, Any]:
    reader = SafeFileSystemReader(path, data_file_sizes(manifest))
    metadata = reader.read_metadata()
    selected = _selector(keys)
    checkpoint: dict[str, Any] = {}
    places: dict[str, tuple[str | int, ...]] = {}
    for fqn, entry in metadata.state_dict_metadata.items():
        where = (metadata.planner_data or {}).get(fqn, (fqn,))
        if not selected(list(where)):
            continue
        tensor = isinstance(entry, TensorStorageMetadata)
        _place(checkpoint, where, torch.empty(entry.size, dtype=entry.properties.dtype)
               if tensor else None)  # fmt: skip
        places[fqn] = where
    if places:
        planner = SafeLoadPlanner(str(path))
        try:
            with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
                warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
                dcp.load(checkpoint, storage_reader=reader, planner=planner, no_dist=True)
        except CheckpointException as e:
            raise _first_failure(e) from None
        for fqn, value in planner.loaded_bytes.items():
            _place(checkpoint, places[fqn], value)
    restore_structure(checkpoint, manifest.get("structure", {}), selected)
    return checkpoint


def read_distributed_checkpoint(
    path: str | os.PathLike[str], keys: set[str] | None = None
) -> dict[str, Any]:
    """Read a sharded checkpoint whole, in this process (no process group), as plain tensors.

    Args:
        path: The checkpoint directory.
        keys: Read only these entries (dotted paths, e.g. ``epoch`` or
            ``state_dict.head.weight``; a key selects everything below it). Default: all.

    Returns:
        The nested checkpoint dict; sharded tables come back as full tensors.

    Raises:
        CheckpointRefused: ``path`` has no valid manifest, a file differs from it, or the
            metadata or a value is not plain data (one line naming the file).

    """
    path = Path(path)
    return _read(path, verify_checkpoint_manifest(path), keys)


def load_distributed_checkpoint(
    path: str | os.PathLike[str],
    model_state: dict[str, Any],
    group: dist.ProcessGroup | None = None,
) -> dict[str, Any]:
    """Collective: load a sharded checkpoint, the model sharded into ``model_state``'s layout.

    Rank 0 checks the files' checksums, the other ranks their sizes, before any metadata
    is read.

    Args:
        path: The checkpoint directory.
        model_state: The current ``module.state_dict()``; its tensors (``ShardedTensor``
            blocks included) are filled in place, resharded from the saved layout.
        group: Process group.

    Returns:
        The checkpoint dict whose ``state_dict`` is ``model_state`` with the saved values
        (non-tensor entries such as tables' formats are read as saved).

    """
    path = Path(path)
    rank, _ = _rank(group)
    error: Exception | None = None
    manifest = None
    if rank == 0:
        try:
            manifest = verify_checkpoint_manifest(path)
        except (OSError, ValueError) as e:
            error = e
    _agree(error, group)
    if manifest is None:  # the other ranks check sizes (rank 0 read it with its checksums)
        manifest = verify_checkpoint_manifest(path, checksums=False)
    reader = SafeFileSystemReader(path, data_file_sizes(manifest))
    metadata = reader.read_metadata()
    tensors = {k: v for k, v in model_state.items() if isinstance(v, torch.Tensor)}
    try:
        dcp.load({MODEL_KEY: tensors}, storage_reader=reader, planner=SafeLoadPlanner(str(path)),
                 process_group=group)  # fmt: skip
    except CheckpointException as e:
        raise _first_failure(e) from None
    others = {f"{MODEL_KEY}.{k}" for k in model_state if k not in tensors}
    top = {str(where[0]) for where in (metadata.planner_data or {}).values()}
    top |= {str(p[0]) for p in manifest.get("structure", {}).get("empty", []) if len(p) == 1}
    checkpoint = _read(path, manifest, (top - {MODEL_KEY}) | others)
    checkpoint[MODEL_KEY] = {**checkpoint.get(MODEL_KEY, {}), **tensors}
    return checkpoint
