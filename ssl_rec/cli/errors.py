"""The command line's error boundary: a user's mistake becomes one or two lines and exit status 2.

Errors the library raises for bad input (``ValueError`` and the file errors), the config
parser's errors and operator errors (:class:`OperatorError`: a busy run directory; a full
disk or quota, ``ENOSPC``/``EDQUOT``, even when another exception wraps it) are reported as
``ssl-rec: error: <what and where>``, the last line printed; the message of a nested
jsonargparse error is reduced to the offending key and its innermost reason. ``--debug``
(or ``SSL_REC_DEBUG=1``) shows the traceback instead. Any other exception is an internal
error and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from ssl_rec._io import DiskFullError, disk_full_error, is_disk_full
from ssl_rec.cli.data_option_hint import data_option_hint


class OperatorError(RuntimeError):
    """A condition of the machine or the run the operator must fix (reported in one line)."""


# Exceptions that carry a message meant for the user (bad data, config values, paths).
USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    KeyError,
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
    argparse.ArgumentError,
    OperatorError,
    DiskFullError,
    MemoryError,  # e.g. a table that does not fit names itself (hardware.TableMemoryError)
)
DEBUG_FLAG = "--debug"
DEBUG_ENV = "SSL_REC_DEBUG"
EXIT_USAGE = 2
_KEY = re.compile(r'Parser key "([^"]+)"')
# Lines of a nested jsonargparse error that explain its structure, not the mistake.
_NOISE = (
    "Does not validate against any of the Union subtypes",
    "Subtypes:",
    "Errors:",
    "Given value type:",
    "Given value:",
    "Expected a <class 'NoneType'>",
    "Problem with given class_path",
    "tip: For details",
)


def debug_requested(argv: Sequence[str]) -> bool:
    """Whether the traceback should be shown (``--debug`` or ``SSL_REC_DEBUG=1``)."""
    return DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _type_name(text: str) -> str:
    text = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", text)
    return re.sub(r"typing\.Literal\[(.*)\]", r"\1", text)


def _alternatives(lines: list[str], depth: int) -> str | None:
    """``Expected int or 'auto'; got autox`` from a union's sibling ``- Expected a`` lines.

    Only the first would be the innermost reason, which hides the other types accepted.
    """
    expected = []
    for line in lines:
        if len(line) - len(line.lstrip()) != depth or not line.strip().startswith("- Expected a "):
            break
        expected.append(_type_name(line.strip().removeprefix("- Expected a ")))
    if len(expected) < 2:
        return None
    given = [line.strip().removeprefix("Given value:").strip() for line in lines
             if line.strip().startswith("Given value:")]  # fmt: skip
    return f"Expected {' or '.join(expected)}" + (f"; got {given[0]}" if given else "")


def summarize_parser_error(message: str) -> str:
    """Reduce a (possibly nested) jsonargparse message to ``key > key: innermost reason``.

    The innermost (most indented) line that is not structure is the reason; the parser keys
    on the lines above it name where it is.
    """
    lines = [line for line in message.splitlines() if line.strip()]
    reasons = [
        (len(line) - len(line.lstrip()), line.strip())
        for line in lines
        if not _KEY.fullmatch(line.strip().rstrip(":")) and not line.strip().startswith(_NOISE)
    ]
    if not reasons:
        return " ".join(line.strip() for line in lines)
    depth, reason = max(reasons, key=lambda r: r[0])
    at = lines.index(" " * depth + reason)
    keys = [k for line in lines[:at] for k in _KEY.findall(line)]
    reason = _alternatives(lines[at:], depth) or reason
    reason = _KEY.sub(lambda m: m.group(1), reason).removeprefix("- ")
    return f"{' > '.join(dict.fromkeys(keys))}: {reason}" if keys else reason


def describe(error: BaseException) -> str:
    """One or two lines saying what is wrong and where."""
    text = str(error)
    if isinstance(error, argparse.ArgumentError) or "Parser key" in text or "Subtypes:" in text:
        return data_option_hint(text) or summarize_parser_error(text)
    if isinstance(error, DiskFullError):
        return str(error.strerror)
    if is_disk_full(error):
        where = f" writing {error.filename}" if error.filename else ""
        return f"no space left on device{where} ({error.strerror or error})"
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    text = text.strip() or type(error).__name__
    if isinstance(error, KeyError):
        text = text.strip("'\"")
    lines = text.splitlines()
    return "\n".join(lines[:2]) + (" ..." if len(lines) > 2 else "")


def fail(error: BaseException) -> NoReturn:
    """Print ``ssl-rec: error: ... (--debug shows the traceback)`` on stderr, exit with status 2.

    The message is the last thing printed, so ``tail -1`` of a log says what went wrong.
    """
    _close_progress_bars()
    sys.stdout.flush()
    print(f"ssl-rec: error: {describe(error)} ({DEBUG_FLAG} shows the traceback)", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def _close_progress_bars() -> None:
    """Close tqdm bars a failed step left open: closed at exit, they would print after the error."""
    tqdm_module = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm_module, "tqdm", None), "_instances", None) or ()):
        bar.close()


def disk_full_in(error: BaseException) -> OSError | None:
    """The full-disk ``OSError`` that ``error`` is or was raised from, else ``None``."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if is_disk_full(current):
            return current  # type: ignore[return-value]
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


@contextlib.contextmanager
def disk_full_names(directory: str | os.PathLike[str]) -> Iterator[None]:
    """Report a full disk met inside the block as writing ``directory`` (if it names nothing).

    Raises:
        DiskFullError: for an ``ENOSPC``/``EDQUOT`` error (or one raised from it) that is not
            already a :class:`DiskFullError`.

    """
    try:
        yield
    except Exception as error:
        full = disk_full_in(error)
        if full is None or isinstance(full, DiskFullError):
            raise
        raise disk_full_error(full.filename or directory) from error


def guarded(command: Callable[[list[str]], Any], argv: Sequence[str]) -> Any:
    """Run ``command(argv)`` (without ``--debug``) inside the error boundary."""
    debug = debug_requested(argv)
    args = [a for a in argv if a != DEBUG_FLAG]
    if debug:
        return command(args)
    try:
        return command(args)
    except USER_ERRORS as error:
        fail(error)
    except Exception as error:
        full = disk_full_in(error)  # e.g. a writer's RuntimeError raised from ENOSPC
        if full is None:
            raise
        fail(full)
