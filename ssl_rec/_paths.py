"""Names that are data, never paths: field, column and table names as file names, and back.

A field name comes from a CSV header or a config, so it may be ``../../x``, ``/etc/y`` or
``..``. :func:`safe_file_name` turns any name into one harmless path component (an ordinary
name such as ``C1`` or ``user_id`` stays itself, so artifacts written before keep their
layout); :func:`inside` resolves a file name read back from an artifact's manifest and
refuses one that would leave the artifact's directory.
"""

from __future__ import annotations

import hashlib
import os
import string
from pathlib import Path, PurePosixPath, PureWindowsPath

__all__ = ["inside", "safe_file_name"]

_SAFE = frozenset(string.ascii_letters + string.digits + "_.-")
MAX_PLAIN_CHARS = 100
"""A safe name longer than this is shortened (file names end at 255 bytes; suffixes and
temporary names are added to the encoded stem)."""
MAX_READABLE_CHARS = 64
HASH_CHARS = 16
HASH_MARK = "~"  # outside _SAFE: a plain (unhashed) name never contains it
_WINDOWS_DEVICES = frozenset(
    ["CON", "PRN", "AUX", "NUL"] + [f"{p}{i}" for p in ("COM", "LPT") for i in range(1, 10)]
)


def _escape(char: str) -> str:
    return "".join(f"%{b:02X}" for b in char.encode("utf-8", "surrogatepass"))


def _reserved(name: str) -> bool:
    # Windows opens a device for CON, con.txt, ...: an artifact copied there must not.
    return name.split(".", 1)[0].upper() in _WINDOWS_DEVICES


def safe_file_name(name: str) -> str:
    """Encode a user- or data-supplied name as one safe path component (no suffix).

    Characters ``[A-Za-z0-9_.-]`` are kept, every other one is written as ``%XX`` per UTF-8
    byte, and a leading ``.`` is escaped (no hidden files, no ``.`` / ``..``). Whenever
    anything was escaped, or the name is empty, longer than :data:`MAX_PLAIN_CHARS`, or a
    Windows device name (``CON``, ``nul.txt``), the result is a readable prefix (at most
    :data:`MAX_READABLE_CHARS` characters) plus ``~`` and 16 hex digits of the name's SHA-256.
    A plain result never contains ``~``, so two different names never share a file, and the
    encoding depends on nothing but the name, so it is the same on every machine.

    Args:
        name: any string (a field, column or table name).

    Returns:
        The file name stem, e.g. ``"C1"`` -> ``"C1"``, ``"a/b"`` -> ``"a%2Fb~c14cddc033f64b9d"``.

    Raises:
        TypeError: ``name`` is not a string.

    Example:
        >>> safe_file_name("user_id")
        'user_id'
        >>> safe_file_name("..").startswith("%2E.~")
        True

    """
    if not isinstance(name, str):
        raise TypeError(f"a file name is made from a string, got {type(name).__name__}")
    pieces = [char if char in _SAFE else _escape(char) for char in name]
    if pieces and pieces[0] == ".":
        pieces[0] = _escape(".")
    plain = "".join(pieces)
    if plain == name and name and len(name) <= MAX_PLAIN_CHARS and not _reserved(name):
        return name
    readable, size = [], 0
    for piece in pieces:
        if size + len(piece) > MAX_READABLE_CHARS:
            break
        readable.append(piece)
        size += len(piece)
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]
    return f"{''.join(readable)}{HASH_MARK}{digest}"


def inside(
    directory: str | os.PathLike[str], relative: object, where: str | os.PathLike[str] | None = None
) -> Path:
    """Join a file name read back from a manifest to its directory, refusing any escape.

    Args:
        directory: the artifact's directory.
        relative: the name the manifest lists (a relative POSIX path such as ``C1.keys.npy``
            or ``train/00000.arrow``).
        where: what listed it (the manifest file), named in the error; default ``directory``.

    Returns:
        ``directory / relative`` (not resolved).

    Raises:
        ValueError: (one line naming ``where``) ``relative`` is not a non-empty string, is
            absolute, has a ``..`` component or a NUL, or resolves outside ``directory``
            through a symbolic link.

    Example:
        >>> inside("/srv/export", "C1.keys.npy")
        PosixPath('/srv/export/C1.keys.npy')

    """
    source = where if where is not None else directory
    refuse = (
        f"{source}: names the file {relative!r}, which is not inside {directory} "
        "(an artifact's manifest may only name files in its own directory)"
    )
    if not isinstance(relative, str) or not relative or "\x00" in relative:
        raise ValueError(refuse)
    posix, windows = PurePosixPath(relative), PureWindowsPath(relative)
    if posix.is_absolute() or windows.anchor or ".." in posix.parts or ".." in windows.parts:
        raise ValueError(refuse)
    path = Path(directory, relative)
    if not path.resolve().is_relative_to(Path(directory).resolve()):
        raise ValueError(refuse + "; it leads out through a symbolic link")
    return path
