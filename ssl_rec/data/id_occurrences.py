"""Occurrences of every encoded id, and of pairs of two fields' ids, in preprocessed rows."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from ssl_rec.data.loader import fixed_list_to_numpy, validate_sparse
from ssl_rec.data.progress import progress_bar
from ssl_rec.data.storage import SPARSE

__all__ = ["count_id_pairs", "count_ids"]

# Rows converted at once: 1M rows of 26 fields are about 100 MB of int32 ids.
_CHUNK_ROWS = 1 << 20
_BAR_MIN_ROWS = 4 * _CHUNK_ROWS


def _id_slices(
    tables: Sequence[pa.Table], cardinalities: Sequence[int], what: str
) -> Iterator[np.ndarray]:
    """``int32[n, F]`` checked ids of all ``tables``' rows, about a million rows at a time.

    Above four slices a progress bar named ``what`` shows the rows read, closed before an
    error propagates (the error stays the last line printed).
    """
    total = sum(t.num_rows for t in tables)
    # A bar only where counting takes seconds (some 0.3 s per million rows of 26 fields).
    bar = progress_bar(what, total) if total > _BAR_MIN_ROWS else None
    try:
        for t, table in enumerate(tables):
            for start in range(0, table.num_rows, _CHUNK_ROWS):
                ids = fixed_list_to_numpy(table.column(SPARSE).slice(start, _CHUNK_ROWS))
                validate_sparse(ids, list(cardinalities), f"{what}, table {t} from row {start}: ")
                yield ids
                if bar is not None:
                    bar.update(len(ids))
    finally:
        if bar is not None:
            bar.close()


def count_ids(tables: Sequence[pa.Table], cardinalities: Sequence[int]) -> list[np.ndarray]:
    """``int64[cardinality_f]`` occurrences of each id of each field over all ``tables``' rows.

    Args:
        tables: tables with a ``sparse`` column (``int32[F]`` lists of encoded ids), read in
            slices of about a million rows (memory-mapped tables stay mapped); above four
            slices a progress bar (plain lines in a log) shows the rows counted.
        cardinalities: ids per field.

    Raises:
        ValueError: an id outside its field's range (``validate_sparse``'s message: the
            table, the slice's first row, the row in it and the field).

    """
    counts = [np.zeros(int(c), np.int64) for c in cardinalities]
    for ids in _id_slices(tables, cardinalities, "id counts"):
        for f, count in enumerate(counts):
            count += np.bincount(ids[:, f], minlength=len(count))
    return counts


def count_id_pairs(
    tables: Sequence[pa.Table], cardinalities: Sequence[int], fields: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of each pair of ids of fields ``a`` and ``b`` that occur together, over ``tables``.

    Args:
        tables: as for :func:`count_ids`.
        cardinalities: ids per field.
        fields: the field indices ``(a, b)``.

    Returns:
        ``(left, right, count)``, ``int64[N]`` each: the ``N`` distinct pairs that occur, in
        the order of ``left * cardinality_b + right``, and their rows.

    Raises:
        ValueError: as :func:`count_ids`.

    """
    a, b = fields
    width = int(cardinalities[b])
    keys: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    for ids in _id_slices(tables, cardinalities, "id pair counts"):
        key, count = np.unique(ids[:, a].astype(np.int64) * width + ids[:, b], return_counts=True)
        keys.append(key)
        counts.append(count)
    if not keys:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    key, where = np.unique(np.concatenate(keys), return_inverse=True)
    count = np.bincount(where, weights=np.concatenate(counts)).astype(np.int64)
    return key // width, key % width, count
