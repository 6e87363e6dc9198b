"""Prediction files: one row per input row, in input order, with the row's key columns.

Every ``ssl-rec predict`` writes one schema, whatever the model (a checkpoint through
:class:`ssl_rec.lightning.PredictionWriter`, a quantized model directory through
:mod:`ssl_rec.cli.predict_quantized`), in this column order:

- ``row`` (``int64``): the row's position in the predicted split, ``0..N-1``;
- the requested key columns, as read from the input file (:func:`key_columns`);
- ``label`` (``float32``) when the input has labels;
- ``probability`` (``float32``): the click probability.

:func:`prediction_file` streams batches into such a file; :func:`write_predictions` writes
all rows at once. Either way the file appears complete at its path or not at all.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ssl_rec._io import atomic_path, fsync_directory, remove_stale_temporaries

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".tsv": "tsv"}
ROW, PROBABILITY, LABEL = "row", "probability", "label"
# The split a data module's predict loader yields (every row of a single predicted file).
PREDICT_SPLIT = "test"
# Rows gathered before a write: Parquet row groups of useful size from small batches.
_FLUSH_ROWS = 1 << 16


def prediction_format(path: str | os.PathLike[str]) -> str:
    """``parquet``, ``csv`` or ``tsv`` from the file suffix (``ValueError`` naming the allowed)."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(
            f"predictions file {path}: unknown suffix {suffix!r}; use one of {sorted(FORMATS)}"
        )
    return FORMATS[suffix]


def key_columns(datamodule: Any, keys: Sequence[str]) -> pa.Table | None:
    """The raw input columns ``keys`` of every predicted row, in the order they are scored.

    Args:
        datamodule: the data module whose predict loader is scored (an
            :class:`ssl_rec.data.ArrowDataModule` reads them back from its input files).
        keys: input column names; empty for none.

    Returns:
        A table of ``len(keys)`` columns and one row per predicted row, or ``None``.

    Raises:
        ValueError: the data keeps no raw columns (e.g. synthetic data), or a key is named
            like a column the file always has (``row``, ``label``, ``probability``).

    """
    keys = list(keys)
    if not keys:
        return None
    clash = sorted({ROW, LABEL, PROBABILITY} & set(keys))
    if clash:
        raise ValueError(
            f"--predictions.keys {clash}: the predictions file has its own {clash} column; "
            "key the rows with other input columns"
        )
    if not callable(getattr(datamodule, "raw_columns", None)):
        raise ValueError(
            f"{type(datamodule).__name__} keeps no raw input columns (asked for {keys}); "
            "write predictions without keys"
        )
    return datamodule.raw_columns(PREDICT_SPLIT, keys)


class PredictionStream:
    """Appends batches of predictions, in input order, to an open prediction file.

    Made by :func:`prediction_file`; the file's columns are fixed by the first batch.

    Args:
        path: the (temporary) file to write.
        kind: ``parquet``, ``csv`` or ``tsv``.
        keys: key columns of every row of the split, or ``None``.

    """

    def __init__(self, path: Path, kind: str, keys: pa.Table | None) -> None:
        self.path, self.kind, self.keys = path, kind, keys
        self.rows = 0
        self._schema: pa.Schema | None = None
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._writer: Any = None

    def write(
        self,
        probability: np.ndarray,
        row: np.ndarray | None = None,
        label: np.ndarray | None = None,
    ) -> None:
        """Append the next rows.

        Args:
            probability: ``float32[B]`` click probabilities of the next ``B`` rows.
            row: ``int64[B]`` their positions in the split; they must continue the rows
                written so far (``rows .. rows + B - 1``); ``None`` numbers them so.
            label: ``float32[B]`` labels, in every batch or in none.

        Raises:
            ValueError: rows out of order, more rows than key rows, labels in some batches only.

        """
        probability = np.asarray(probability, np.float32).reshape(-1)
        n = len(probability)
        expected = np.arange(self.rows, self.rows + n, dtype=np.int64)
        if row is not None and not np.array_equal(np.asarray(row).reshape(-1), expected):
            raise ValueError(
                f"prediction rows out of order after row {self.rows - 1}: the predictions "
                "file holds every row of the split once, in input order"
            )
        if self.keys is not None and self.rows + n > self.keys.num_rows:
            raise ValueError(
                f"{self.keys.num_rows} rows of key columns for {self.rows + n} predictions"
            )
        columns: dict[str, Any] = {ROW: pa.array(expected)}
        if self.keys is not None:
            part = self.keys.slice(self.rows, n)
            columns |= {name: part.column(name) for name in part.column_names}
        if label is not None:
            columns[LABEL] = pa.array(np.asarray(label, np.float32).reshape(-1))
        columns[PROBABILITY] = pa.array(probability)
        table = pa.table(columns)
        if self._schema is None:
            self._schema = table.schema
        elif table.schema.names != self._schema.names:
            raise ValueError("labels in some prediction batches only: give them for every batch")
        self._pending.append(table)
        self._pending_rows += n
        self.rows += n
        if self._pending_rows >= _FLUSH_ROWS:
            self._flush()

    def finish(self) -> None:
        """Write what is pending and check that every key row got a prediction."""
        if self.keys is not None and self.rows != self.keys.num_rows:
            raise ValueError(
                f"{self.keys.num_rows} rows of key columns for {self.rows} predictions"
            )
        if self._schema is None:  # no rows: the file still has the columns
            fields = [pa.field(ROW, pa.int64())]
            fields += list(self.keys.schema) if self.keys is not None else []
            self._schema = pa.schema([*fields, pa.field(PROBABILITY, pa.float32())])
            self._pending.append(self._schema.empty_table())
        self._flush(force=True)

    def close(self) -> None:
        """Close the underlying writer (after :meth:`finish`, or on an error)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _flush(self, force: bool = False) -> None:
        if not self._pending or (not force and self._pending_rows < _FLUSH_ROWS):
            return
        if self._writer is None:
            self._writer = self._open()
        self._writer.write_table(pa.concat_tables(self._pending))
        self._pending, self._pending_rows = [], 0

    def _open(self) -> Any:
        if self.kind == "parquet":
            return pq.ParquetWriter(str(self.path), self._schema)
        options = pacsv.WriteOptions(delimiter="," if self.kind == "csv" else "\t")
        return pacsv.CSVWriter(str(self.path), self._schema, write_options=options)


@contextlib.contextmanager
def prediction_file(
    path: str | os.PathLike[str], keys: pa.Table | Mapping[str, np.ndarray] | None = None
) -> Iterator[PredictionStream]:
    """Open ``path`` for batches of predictions; it appears, complete, when the block ends.

    Args:
        path: ``.parquet``/``.pq`` (Parquet), ``.csv`` or ``.tsv``.
        keys: key columns of every row of the split (``N`` rows; see :func:`key_columns`),
            or ``None``.

    Yields:
        A :class:`PredictionStream`; if the block raises, or its rows do not match the key
        rows, no file is written and an older one at ``path`` is left as it was.

    Raises:
        ValueError: an unknown suffix (before anything is written), or the rows' errors of
            :meth:`PredictionStream.write` and :meth:`PredictionStream.finish`.

    Example:
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp()) / "pred.csv"
        >>> with prediction_file(out, {"user": np.array(["a", "b", "c"])}) as stream:
        ...     stream.write(np.array([0.25, 0.5]), label=np.array([0.0, 1.0]))
        ...     stream.write(np.array([0.75]), row=np.array([2]), label=np.array([1.0]))
        >>> print(out.read_text().strip())
        "row","user","label","probability"
        0,"a",0,0.25
        1,"b",1,0.5
        2,"c",1,0.75

    """
    kind = prediction_format(path)
    table = keys if isinstance(keys, pa.Table) or keys is None else pa.table(dict(keys))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    with atomic_path(path) as tmp:
        stream = PredictionStream(tmp, kind, table)
        try:
            yield stream
            stream.finish()
        finally:
            stream.close()
        with open(tmp, "rb") as f:  # on disk before the rename makes it the file
            os.fsync(f.fileno())
    fsync_directory(path.parent)


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
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp()) / "pred.parquet"
        >>> path = write_predictions(out, np.array([0.1, 0.7]), {"user": np.array(["a", "b"])})
        >>> pq.read_table(path).schema.names
        ['row', 'user', 'probability']

    """
    with prediction_file(path, keys) as stream:
        stream.write(probability, label=label)
    return Path(path)
