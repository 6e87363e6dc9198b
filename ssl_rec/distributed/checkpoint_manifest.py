"""The library's own manifest of a sharded checkpoint directory: ``ssl_rec_checkpoint.json``.

DCP marks a checkpoint with its pickled ``.metadata``; recognising a directory by that file
would mean unpickling whatever it holds. The manifest, written by rank 0 after DCP's save
completed, is what makes a directory a checkpoint of this library: format version, world
size, every file with its size and SHA-256 (checked before ``.metadata`` is opened), and
what DCP's flattening loses of the saved dict's structure (mappings with integer keys, such
as an optimizer's per-parameter ``state``, and empty mappings), so a read gives back the
dict that was saved.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from ssl_rec._io import atomic_write_json, file_checksum, verification_enabled, verify_file
from ssl_rec.distributed.checkpoint_reader import (
    DATA_FILE_PATTERN,
    METADATA_FILENAME,
    CheckpointRefused,
)

CHECKPOINT_MANIFEST = "ssl_rec_checkpoint.json"
CHECKPOINT_FORMAT = "ssl-rec sharded checkpoint"
CHECKPOINT_FORMAT_VERSION = 1
_MAX_MANIFEST_BYTES = 64 << 20
KeyPath = list[str | int]

__all__ = [
    "CHECKPOINT_MANIFEST",
    "data_file_sizes",
    "dict_structure",
    "restore_structure",
    "verify_checkpoint_manifest",
    "write_checkpoint_manifest",
]


def dict_structure(checkpoint: Mapping[str, Any]) -> dict[str, list[KeyPath]]:
    """Where ``checkpoint`` has mappings DCP would not give back as saved.

    DCP turns mapping keys into strings and drops empty mappings. Mappings are walked
    through mappings and lists, as DCP walks them (values inside tuples travel whole).

    Returns:
        ``{"int_keyed": [path, ...], "empty": [path, ...]}``, paths as key lists (integer
        keys of integer-keyed mappings and list positions stay integers).

    """
    found: dict[str, list[KeyPath]] = {"int_keyed": [], "empty": []}

    def walk(value: Any, path: KeyPath) -> None:
        if isinstance(value, Mapping):
            if not value:
                found["empty"].append(path)
            elif all(type(k) is int for k in value):
                found["int_keyed"].append(path)
            for key, item in value.items():
                walk(item, [*path, key if type(key) is int else str(key)])
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, [*path, i])

    for key, value in checkpoint.items():
        walk(value, [str(key)])
    return found


def _container(root: Any, path: KeyPath, create: bool) -> Any:
    node = root
    for key in path:
        if isinstance(node, list) and type(key) is int and 0 <= key < len(node):
            node = node[key]
        elif isinstance(node, dict) and (key in node or create):
            node = node.setdefault(key, {})
        else:
            return None
    return node


def restore_structure(
    checkpoint: dict[str, Any],
    structure: Mapping[str, list[KeyPath]],
    selected: Callable[[KeyPath], bool] = lambda path: True,
) -> None:
    """Undo DCP's flattening in place: integer keys and empty mappings (:func:`dict_structure`).

    Args:
        checkpoint: The dict as DCP read it.
        structure: The manifest's record of it.
        selected: Whether a path was read (a partial read restores only those).

    """
    for path in sorted(structure.get("int_keyed", []), key=len):
        node = _container(checkpoint, list(path), create=False)
        if isinstance(node, dict):
            items = list(node.items())
            node.clear()
            node.update((int(k) if isinstance(k, str) and k.lstrip("-").isdigit() else k, v)
                        for k, v in items)  # fmt: skip
    for path in sorted(structure.get("empty", []), key=len):
        if path and selected(list(path)):
            parent = _container(checkpoint, list(path[:-1]), create=True)
            if isinstance(parent, dict):
                parent.setdefault(path[-1], {})


def write_checkpoint_manifest(
    directory: str | os.PathLike[str],
    world_size: int,
    structure: Mapping[str, list[KeyPath]] | None = None,
) -> Path:
    """Write ``ssl_rec_checkpoint.json`` into a DCP directory whose save has completed.

    Also the way to adopt a DCP directory written by another tool, if its origin is trusted
    (its metadata is still read through the allow-list unpickler).

    Args:
        directory: The checkpoint directory (DCP's files, nothing else).
        world_size: Processes that wrote it.
        structure: :func:`dict_structure` of the saved dict.

    Returns:
        The manifest's path.

    """
    directory = Path(directory)
    files = {}
    for entry in sorted(directory.iterdir()):
        if entry.name == CHECKPOINT_MANIFEST or not entry.is_file():
            continue
        checksum = file_checksum(entry, "sha256")
        files[entry.name] = {"size": entry.stat().st_size, "sha256": checksum.partition(":")[2]}
    manifest = {
        "format": CHECKPOINT_FORMAT,
        "format_version": CHECKPOINT_FORMAT_VERSION,
        "world_size": int(world_size),
        "writer": f"torch.distributed.checkpoint (torch {torch.__version__})",
        "files": files,
        "structure": {k: list(v) for k, v in (structure or {}).items()},
    }
    return atomic_write_json(directory / CHECKPOINT_MANIFEST, manifest)


def _load_manifest(path: Path) -> dict[str, Any]:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise CheckpointRefused(
            f"{path.parent}: not an ssl-rec sharded checkpoint (no {CHECKPOINT_MANIFEST}); "
            "its DCP metadata is not read without one"
        ) from None
    if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_MANIFEST_BYTES:
        raise CheckpointRefused(f"{path}: not a regular manifest file")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointRefused(f"{path}: not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointRefused(f"{path}: not an {CHECKPOINT_FORMAT} manifest")
    version = manifest.get("format_version")
    if type(version) is not int or not 1 <= version <= CHECKPOINT_FORMAT_VERSION:
        raise CheckpointRefused(
            f"{path}: format version {version!r}; this ssl-rec reads 1..{CHECKPOINT_FORMAT_VERSION}"
            " (written by a newer ssl-rec?)"
        )
    return manifest


def _check_layout(manifest: dict[str, Any], where: Path) -> dict[str, dict[str, Any]]:
    files = manifest.get("files")
    structure = manifest.get("structure", {})
    if not isinstance(files, dict) or METADATA_FILENAME not in files:
        raise CheckpointRefused(f"{where}: lists no {METADATA_FILENAME}")
    for name, entry in files.items():
        if not DATA_FILE_PATTERN.fullmatch(name) and name != METADATA_FILENAME:
            raise CheckpointRefused(f"{where}: lists a file outside its directory: {name!r}")
        if not (
            isinstance(entry, dict)
            and type(entry.get("size")) is int
            and isinstance(entry.get("sha256"), str)
        ):
            raise CheckpointRefused(f"{where}: malformed entry for {name!r}")
    paths_ok = isinstance(structure, dict) and all(
        isinstance(paths, list)
        and all(isinstance(p, list) and all(type(k) in (str, int) for k in p) for p in paths)
        for paths in structure.values()
    )
    if type(manifest.get("world_size")) is not int or not paths_ok:
        raise CheckpointRefused(f"{where}: malformed manifest")
    return files


def verify_checkpoint_manifest(
    directory: str | os.PathLike[str], checksums: bool = True
) -> dict[str, Any]:
    """Check a sharded checkpoint directory against its manifest before anything is unpickled.

    Args:
        directory: The checkpoint directory.
        checksums: Also compare every file's SHA-256 (skipped when ``SSL_REC_VERIFY=0``);
            sizes and file types are always checked.

    Returns:
        The manifest (``files``, ``world_size``, ``structure``, ...).

    Raises:
        CheckpointRefused: naming the directory or file that does not match (a missing
            manifest, a file missing, of another size or type, a malformed manifest).
        ssl_rec._io.ChecksumError: naming a file whose bytes changed.

    """
    directory = Path(directory)
    where = directory / CHECKPOINT_MANIFEST
    manifest = _load_manifest(where)
    for name, entry in _check_layout(manifest, where).items():
        path = directory / name
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            raise CheckpointRefused(f"{path}: missing (listed in {CHECKPOINT_MANIFEST})") from None
        if not stat.S_ISREG(info.st_mode):
            raise CheckpointRefused(f"{path}: not a regular file")
        if info.st_size != entry["size"]:
            raise CheckpointRefused(
                f"{path}: {info.st_size} bytes, {entry['size']} when written (truncated?)"
            )
        if checksums and verification_enabled():
            verify_file(path, f"sha256:{entry['sha256']}", "the checkpoint is damaged")
    return manifest


def data_file_sizes(manifest: Mapping[str, Any]) -> dict[str, int]:
    """The checkpoint's data files (every listed file but ``.metadata``) and their sizes."""
    files = manifest["files"]
    return {n: int(e["size"]) for n, e in files.items() if n != METADATA_FILENAME}
