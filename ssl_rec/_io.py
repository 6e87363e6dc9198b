"""Atomic writes: a file or directory appears complete at its final path, or not at all.

Everything is written to a temporary sibling first and renamed into place, so an interrupted
run never leaves a partial cache, checkpoint or export that a later run would trust. The
temporary name carries the writer's process id (``.<name>.<pid>.<random>.tmp``), so the
leftovers of a killed run are recognised and removed by the next write of the same path;
:class:`FileLock` keeps two processes from building the same thing at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _tmp_sibling(path: Path, kind: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    maker = tempfile.mkdtemp if kind == "dir" else tempfile.mkstemp
    made = maker(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    if isinstance(made, tuple):
        os.close(made[0])
        made = made[1]
    # mkstemp/mkdtemp create private (0600/0700) entries; give the final file or directory
    # the permissions a plain open()/mkdir() would, so other users can read exports.
    os.chmod(made, (0o777 if kind == "dir" else 0o666) & ~_umask())
    return Path(made)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` via a temporary file and ``os.replace``."""
    path = Path(path)
    remove_stale_temporaries(path)
    tmp = _tmp_sibling(path, "file")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write; it replaces ``path`` when the block succeeds.

    For writers that take a file name (Parquet, Arrow, CSV); if the block raises, the
    temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    tmp = _tmp_sibling(path, "file")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str], overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that is renamed to ``path`` when the block succeeds.

    If the block raises, the temporary directory is removed and ``path`` is untouched.

    Args:
        path: final directory path.
        overwrite: replace an existing directory at ``path``; otherwise raise
            ``FileExistsError``.

    Example:
        >>> with atomic_directory("/tmp/export") as tmp:  # doctest: +SKIP
        ...     (tmp / "manifest.json").write_text("{}")

    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True to replace it")
    remove_stale_temporaries(path)
    tmp = _tmp_sibling(path, "dir")
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """Temporary siblings of ``path`` left by processes that no longer run.

    Args:
        path: a final file or directory path written with this module's helpers.

    Returns:
        Paths ``.<name>.<pid>.<random>.tmp`` (and ``.<name>.old-<pid>``) whose process is dead.

    """
    path = Path(path)
    if not path.parent.is_dir():
        return []
    stale = []
    for entry in path.parent.iterdir():
        rest = entry.name.removeprefix(f".{path.name}.")
        if rest == entry.name:
            continue
        pid = rest.split(".")[0].removeprefix("old-")
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            stale.append(entry)
    return stale


def remove_stale_temporaries(path: str | os.PathLike[str]) -> list[Path]:
    """Delete :func:`stale_temporaries` of ``path`` (logging each); return what was removed."""
    removed = []
    for entry in stale_temporaries(path):
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        log.warning("removed %s, left by an interrupted run", entry)
        removed.append(entry)
    return removed


class FileLock:
    """An exclusive ``flock`` on ``<path>`` held inside a ``with`` block (POSIX).

    The operating system releases it when the process dies, so a killed run never blocks
    the next one.

    Args:
        path: lock file (created if missing; left in place).
        message: logged once if another process holds the lock and this one waits.

    Example:
        >>> with FileLock("/tmp/cache/.entry.lock"):  # doctest: +SKIP
        ...     build_entry()

    """

    def __init__(self, path: str | os.PathLike[str], message: str = "") -> None:
        self.path, self.message = Path(path), message
        self._fd: int | None = None

    def __enter__(self) -> FileLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for %s: %s", self.path, self.message or "held by another process")
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
