"""Occurrences of every encoded id of every field in a table of preprocessed rows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from ssl_rec.data.loader import fixed_list_to_numpy
from ssl_rec.data.storage import SPARSE

__all__ = ["count_ids"]

# Rows converted at once: 1M rows of 26 fields are about 100 MB of int32 ids.
_CHUNK_ROWS = 1 << 20


def count_ids(tables: Sequence[pa.Table], cardinalities: Sequence[int]) -> list[np.ndarray]:
    """``int64[cardinality_f]`` occurrences of each id of each field over all ``tables``' rows.

    Args:
        tables: tables with a ``sparse`` column (``int32[F]`` lists of encoded ids), read in
            slices of about a million rows (memory-mapped tables stay mapped).
        cardinalities: ids per field.

    Raises:
        ValueError: an id outside its field's range.

    """
    counts = [np.zeros(int(c), np.int64) for c in cardinalities]
    for table in tables:
        for start in range(0, table.num_rows, _CHUNK_ROWS):
            ids = fixed_list_to_numpy(table.column(SPARSE).slice(start, _CHUNK_ROWS))
            for f, count in enumerate(counts):
                column = ids[:, f]
                if column.size and (column.min() < 0 or column.max() >= len(count)):
                    raise ValueError(
                        f"field {f}: ids outside 0..{len(count) - 1} in the counted rows"
                    )
                count += np.bincount(column, minlength=len(count))
    return counts
