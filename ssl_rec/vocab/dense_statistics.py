"""Statistics of the dense columns fitted on the training split: they travel like vocabularies.

Preprocessing fits them on the training rows after the source's transform
(``log1p(max(x, 0))``, missing -> 0) and stores them in the schema of the cache entry
(``metadata["dense_statistics"]``); a backbone keeps them as buffers, so a checkpoint
standardizes new data with its training statistics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

DENSE_STATISTICS_KEY = "dense_statistics"
DENSE_QUANTILE_BINS = 32
DENSE_STATISTICS_FORMAT = 1


@dataclass(frozen=True)
class DenseStatistics:
    """Per-column mean, standard deviation and quantile edges of the training rows.

    Args:
        columns: names of the ``n_dense`` columns, in order.
        mean: ``float64[n_dense]`` means.
        std: ``float64[n_dense]`` population standard deviations (0 for a constant column).
        quantile_edges: ``float64[n_dense, bins + 1]`` quantiles at ``0, 1/bins, ..., 1``
            (minimum to maximum; repeated edges where a value is frequent).
        rows: training rows they were fitted on.

    """

    columns: tuple[str, ...]
    mean: np.ndarray
    std: np.ndarray
    quantile_edges: np.ndarray
    rows: int

    def __post_init__(self) -> None:
        n = len(self.columns)
        object.__setattr__(self, "columns", tuple(str(c) for c in self.columns))
        for name in ("mean", "std", "quantile_edges"):
            object.__setattr__(self, name, np.asarray(getattr(self, name), np.float64))
        if self.mean.shape != (n,) or self.std.shape != (n,):
            raise ValueError(
                f"dense statistics: {n} columns but mean {self.mean.shape}, std {self.std.shape}"
            )
        if self.quantile_edges.ndim != 2 or self.quantile_edges.shape[0] != n:
            raise ValueError(
                f"dense statistics: {n} columns but quantile edges {self.quantile_edges.shape}"
            )
        values = [self.mean, self.std, self.quantile_edges]
        if not all(np.isfinite(v).all() for v in values) or (self.std < 0).any():
            raise ValueError("dense statistics must be finite with std >= 0")

    @property
    def bins(self) -> int:
        """Number of quantile bins (edges minus one)."""
        return int(self.quantile_edges.shape[1]) - 1

    def select(self, columns: Sequence[str]) -> DenseStatistics:
        """The statistics of ``columns`` (by name, in that order).

        Raises:
            ValueError: naming the columns these statistics do not describe.

        """
        index = {name: i for i, name in enumerate(self.columns)}
        missing = [c for c in columns if c not in index]
        if missing:
            raise ValueError(
                f"dense statistics describe columns {list(self.columns)[:10]}, not {missing[:10]}"
            )
        rows = [index[c] for c in columns]
        return DenseStatistics(tuple(columns), self.mean[rows], self.std[rows],
                               self.quantile_edges[rows], self.rows)  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (stored in the schema's metadata)."""
        return {
            "format": DENSE_STATISTICS_FORMAT,
            "columns": list(self.columns),
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
            "quantile_edges": self.quantile_edges.tolist(),
            "rows": int(self.rows),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "dense statistics") -> DenseStatistics:
        """Read :meth:`to_dict`'s form back (``ValueError`` naming ``where`` if malformed)."""
        try:
            if data.get("format") != DENSE_STATISTICS_FORMAT:
                raise ValueError(f"format {data.get('format')!r} is not {DENSE_STATISTICS_FORMAT}")
            edges = data["quantile_edges"]
            n_edges = len(edges[0]) if edges else DENSE_QUANTILE_BINS + 1
            return cls(
                tuple(data["columns"]),
                np.asarray(data["mean"], np.float64),
                np.asarray(data["std"], np.float64),
                np.asarray(edges, np.float64).reshape(len(edges), n_edges),
                int(data["rows"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"{where}: not dense statistics ({e})") from e

    @classmethod
    def from_schema_metadata(cls, metadata: Mapping[str, Any]) -> DenseStatistics | None:
        """The statistics a schema's ``metadata`` holds, or ``None`` (none fitted)."""
        data = metadata.get(DENSE_STATISTICS_KEY)
        return None if data is None else cls.from_dict(data, "schema metadata")


class DenseMoments:
    """Streaming mean / variance of ``float[N, n]`` blocks (Chan et al.'s pairwise update).

    Exact in float64 whatever the block sizes; the order of blocks changes only rounding.

    Args:
        n_columns: ``n``.

    """

    def __init__(self, n_columns: int) -> None:
        self.rows = 0
        self.mean = np.zeros(n_columns, np.float64)
        self.m2 = np.zeros(n_columns, np.float64)

    def add(self, block: np.ndarray) -> None:
        """Fold in the rows of ``block`` (``[N, n]``)."""
        block = np.asarray(block, np.float64)
        count = block.shape[0]
        if count == 0:
            return
        mean = block.mean(0)
        m2 = ((block - mean) ** 2).sum(0)
        total = self.rows + count
        delta = mean - self.mean
        self.mean += delta * (count / total)
        self.m2 += m2 + delta**2 * (self.rows * count / total)
        self.rows = total

    @property
    def std(self) -> np.ndarray:
        """Population standard deviation ``float64[n]`` (0 before any row)."""
        return np.sqrt(self.m2 / self.rows) if self.rows else np.zeros_like(self.m2)


def dense_statistics_of(
    columns: Sequence[str],
    moments: DenseMoments,
    sample: np.ndarray,
    bins: int = DENSE_QUANTILE_BINS,
) -> DenseStatistics | None:
    """:class:`DenseStatistics` of accumulated ``moments`` and the quantiles of ``sample``.

    Args:
        columns: the ``n`` column names.
        moments: every training row folded in.
        sample: ``float[M, n]`` rows to take quantiles of (all rows, or an even subsample).
        bins: quantile bins per column.

    Returns:
        The statistics, or ``None`` when there is no row (a split of test rows only).

    """
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    if moments.rows == 0:
        return None
    sample = np.asarray(sample, np.float64).reshape(-1, len(columns))
    if len(sample) == 0 or len(columns) == 0:
        edges = np.zeros((len(columns), bins + 1))
    else:
        edges = np.quantile(sample, np.linspace(0.0, 1.0, bins + 1), axis=0).T
    return DenseStatistics(tuple(columns), moments.mean, moments.std, edges, moments.rows)
