"""The seeded train/valid/test split of a dataset held whole in memory (packaged datasets).

A permutation of the rows seeded with ``split_seed`` is cut into consecutive pieces of the
given fractions (the last piece takes the rest); each piece keeps the table's row order
and is written as ``<split>.parquet``, a directory the tabular pipeline reads as its splits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SPLIT_FRACTIONS = {"train": 0.8, "valid": 0.1, "test": 0.1}


def write_seeded_splits(
    table: pa.Table,
    out_dir: Path,
    split_seed: int,
    fractions: dict[str, float] | None = None,
) -> dict[str, int]:
    """Write ``<split>.parquet`` for each split of a seeded permutation of ``table``'s rows.

    Args:
        table: all rows of the dataset.
        out_dir: existing directory receiving ``train/valid/test.parquet``.
        split_seed: seed of the permutation (same seed, same split).
        fractions: ``split -> fraction`` in cutting order (default 80/10/10); the last
            split takes the rows the rounding left.

    Returns:
        ``split -> number of rows`` written.

    """
    fractions = fractions or SPLIT_FRACTIONS
    order = np.random.default_rng(split_seed).permutation(table.num_rows)
    sizes, start = {}, 0
    last = list(fractions)[-1]
    for name, fraction in fractions.items():
        stop = len(order) if name == last else start + round(fraction * len(order))
        rows = pa.array(np.sort(order[start:stop]))
        pq.write_table(table.take(rows), out_dir / f"{name}.parquet")
        sizes[name], start = stop - start, stop
    return sizes
