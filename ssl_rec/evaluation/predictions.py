"""Prediction files: one row per input row, in input order, with the row's key columns.

:func:`write_predictions` is the one writer: ``ssl-rec predict`` calls it through
:class:`ssl_rec.lightning.PredictionWriter`, and any other scorer (a quantized model, a
service) can call it with its own probabilities.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ssl_rec._io import atomic_path

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".tsv": "tsv"}
ROW, PROBABILITY, LABEL = "row", "probability", "label"


def prediction_format(path: str | os.PathLike[str]) -> str:
    """``parquet``, ``csv`` or ``tsv`` from the file suffix (``ValueError`` naming the allowed)."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(
            f"predictions file {path}: unknown suffix {suffix!r}; use one of {sorted(FORMATS)}"
        )
    return FORMATS[suffix]


def write_predictions(
    path: str | os.PathLike[str],
    probability: np.ndarray,
    keys: pa.Table | Mapping[str, np.ndarray] | None = None,
    label: np.ndarray | None = None,
) -> Path:
    """Write ``row``, the key columns, ``label`` (if given) and ``probability`` atomically.

    Args:
        path: ``.parquet``/``.pq`` (Parquet), ``.csv`` or ``.tsv``.
        probability: ``float32[N]`` click probability of input row ``0..N-1``, in order.
        keys: columns identifying each row (e.g. ids read from the input file), ``N`` rows.
        label: ``float32[N]`` labels, when the input had them.

    Returns:
        ``path``.

    Raises:
        ValueError: unknown suffix, or columns of another length than ``probability``.

    Example:
        >>> keys = {"user": np.array(["a", "b"])}
        >>> write_predictions("pred.csv", np.array([0.1, 0.7]), keys)  # doctest: +SKIP

    """
    kind = prediction_format(path)
    n = len(probability)
    columns: dict[str, pa.Array] = {ROW: pa.array(np.arange(n, dtype=np.int64))}
    table = keys if isinstance(keys, pa.Table) else pa.table(dict(keys or {}))
    if table.num_columns and table.num_rows != n:
        raise ValueError(f"{table.num_rows} rows of key columns for {n} predictions")
    columns |= {name: table.column(name) for name in table.column_names}
    if label is not None:
        columns[LABEL] = pa.array(np.asarray(label, np.float32))
    columns[PROBABILITY] = pa.array(np.asarray(probability, np.float32))
    out = pa.table(columns)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        if kind == "parquet":
            pq.write_table(out, tmp)
        else:
            options = pacsv.WriteOptions(delimiter="," if kind == "csv" else "\t")
            pacsv.write_csv(out, tmp, write_options=options)
    return Path(path)
