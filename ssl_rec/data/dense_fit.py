"""Fit the dense columns' statistics on the training split of a cache entry being written.

One streaming pass over the memory-mapped training shards, whatever the source: exact
moments over every row, quantile edges over an evenly strided subsample of at most
``sample_rows`` rows (the same rows whatever the shard or batch sizes).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from ssl_rec.data.storage import DENSE
from ssl_rec.vocab import DENSE_QUANTILE_BINS, DenseMoments, DenseStatistics, dense_statistics_of

SAMPLE_ROWS = 1 << 20


def _shards(entry: Path, split: str) -> list[pa.Table]:
    tables = []
    for path in sorted((entry / split).glob("*.arrow")):
        with pa.memory_map(str(path)) as source:
            tables.append(pa.ipc.open_stream(source).read_all())
    return tables


def fit_split_dense_statistics(
    entry: str | Path,
    columns: Sequence[str],
    split: str = "train",
    bins: int = DENSE_QUANTILE_BINS,
    sample_rows: int = SAMPLE_ROWS,
) -> DenseStatistics | None:
    """Statistics of the ``dense`` column of ``<entry>/<split>/*.arrow``.

    Args:
        entry: the cache entry (its temporary directory while it is built).
        columns: the dense column names (``n_dense``).
        split: the split fitted on (the training split: never validation or test rows).
        bins: quantile bins per column.
        sample_rows: rows the quantiles are taken of at most.

    Returns:
        The statistics, or ``None`` for an empty split or data without dense columns.

    """
    if not columns:
        return None
    tables = _shards(Path(entry), split)
    total = sum(t.num_rows for t in tables)
    stride = max(1, -(-total // sample_rows))
    moments, sample, seen = DenseMoments(len(columns)), [], 0
    for table in tables:
        for batch in table.column(DENSE).chunks:
            block = batch.flatten().to_numpy(zero_copy_only=False).reshape(-1, len(columns))
            moments.add(block)
            first = (-seen) % stride
            sample.append(np.array(block[first::stride], np.float64))
            seen += len(block)
    rows = np.concatenate(sample) if sample else np.zeros((0, len(columns)))
    return dense_statistics_of(columns, moments, rows, bins)
