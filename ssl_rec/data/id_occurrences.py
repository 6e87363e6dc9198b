"""Occurrences of every encoded id of every field in a table of preprocessed rows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from ssl_rec.data.loader import fixed_list_to_numpy, validate_sparse
from ssl_rec.data.progress import progress_bar
from ssl_rec.data.storage import SPARSE

__all__ = ["count_ids"]

# Rows converted at once: 1M rows of 26 fields are about 100 MB of int32 ids.
_CHUNK_ROWS = 1 << 20
_BAR_MIN_ROWS = 4 * _CHUNK_ROWS


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
    total = sum(t.num_rows for t in tables)
    # A bar only where counting takes seconds (some 0.3 s per million rows of 26 fields).
    bar = progress_bar("id counts", total) if total > _BAR_MIN_ROWS else None
    try:
        for t, table in enumerate(tables):
            for start in range(0, table.num_rows, _CHUNK_ROWS):
                ids = fixed_list_to_numpy(table.column(SPARSE).slice(start, _CHUNK_ROWS))
                where = f"id counts, table {t} from row {start}: "
                validate_sparse(ids, list(cardinalities), where)
                for f, count in enumerate(counts):
                    count += np.bincount(ids[:, f], minlength=len(count))
                if bar is not None:
                    bar.update(len(ids))
    finally:
        if bar is not None:  # closed before an error is printed: the error stays last
            bar.close()
    return counts
