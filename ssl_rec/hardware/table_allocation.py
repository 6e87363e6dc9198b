"""Declared tables and allocation failures: tables that take no memory until a shard needs it.

Inside :func:`declare_tables`, a new ``MixedPrecisionEmbeddingCollection`` puts its tables on
the meta device: shapes, specs and streams, no bytes. A sharded run then allocates on each
rank only the rows that rank owns (``ssl_rec.distributed``); one process allocates the whole
tables at their first use. Initial rows depend on the table, its seed and the row, never on
the world size (``EmbeddingTable.init_normal``), so both end up with the same values.

An allocation that the operating system refuses (an address-space or data limit, no memory
left) raises :class:`TableMemoryError` naming the table and the bytes it asked for.
"""

from __future__ import annotations

import contextlib
import errno
import threading
from collections.abc import Iterator

__all__ = [
    "TableMemoryError",
    "allocating",
    "declare_tables",
    "declared_state",
    "declaring",
    "reading_declared_state",
]

_STATE = threading.local()


@contextlib.contextmanager
def _thread_flag(name: str) -> Iterator[None]:
    """Set this thread's flag ``name`` inside the block; restore it after (nesting keeps it)."""
    previous = getattr(_STATE, name, False)
    setattr(_STATE, name, True)
    try:
        yield
    finally:
        setattr(_STATE, name, previous)


@contextlib.contextmanager
def declare_tables() -> Iterator[None]:
    """Collections built inside this block declare their tables without allocating them.

    Example:
        >>> from ssl_rec.hardware import MixedPrecisionEmbeddingCollection
        >>> with declare_tables():
        ...     emb = MixedPrecisionEmbeddingCollection([10**9], 64)  # no 256 GB allocated
        >>> emb.declared
        True

    """
    with _thread_flag("declaring"):
        yield


def declaring() -> bool:
    """Whether tables built now are declared only (inside :func:`declare_tables`)."""
    return bool(getattr(_STATE, "declaring", False))


@contextlib.contextmanager
def declared_state() -> Iterator[None]:
    """``state_dict()`` inside this block leaves declared tables declared (meta tensors).

    Their entries keep their shapes and dtypes, no values: enough to compare a model's
    layout with a checkpoint's (``ssl-rec fit --ckpt_path``) before a sharded run allocates
    only each rank's rows. Loading full tensors keeps them
    pending until the tables are allocated or sharded.

    Example:
        >>> from ssl_rec.hardware import MixedPrecisionEmbeddingCollection
        >>> with declare_tables():
        ...     emb = MixedPrecisionEmbeddingCollection([10**9], 64)
        >>> with declared_state():
        ...     state = emb.state_dict()
        >>> state["group.tables.0.store"].is_meta, emb.declared
        (True, True)

    """
    with _thread_flag("reading"):
        yield


def reading_declared_state() -> bool:
    """Whether ``state_dict()`` now keeps declared tables declared (:func:`declared_state`)."""
    return bool(getattr(_STATE, "reading", False))


class TableMemoryError(MemoryError):
    """A table's buffer could not be allocated (the message names the table and the bytes)."""


def _out_of_memory(error: BaseException) -> bool:
    if isinstance(error, MemoryError):
        return True
    if isinstance(error, OSError):
        return error.errno == errno.ENOMEM
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


@contextlib.contextmanager
def allocating(table: str, what: str, nbytes: int) -> Iterator[None]:
    """Turn a refused allocation inside the block into :class:`TableMemoryError`.

    Args:
        table: The table's name.
        what: The buffer (``store``, ``cache``, ``optimizer state``) and its shape.
        nbytes: Bytes asked for.

    Raises:
        TableMemoryError: When the block fails for lack of memory (torch's allocator
            error, ``MemoryError`` or ``ENOMEM``); other errors pass unchanged.

    """
    try:
        yield
    except (MemoryError, OSError, RuntimeError) as error:
        if isinstance(error, TableMemoryError) or not _out_of_memory(error):
            raise
        raise TableMemoryError(
            f"table {table!r}: out of memory allocating its {what} ({nbytes / 2**20:.1f} MiB); "
            "shard the tables over more processes (docs/scale-out.md), give them a "
            "memory-mapped store (TableSpec.store_dir) or fewer cache rows"
        ) from error
