"""Validation and transforms of label and dense columns, with file + line in every error.

Dense values become ``log(1 + max(x, 0))`` (``"log1p"``, DLRM's Criteo convention),
``sign(x) log(1 + |x|)`` (``"signed_log1p"``) or stay as read (``"none"``), missing -> 0;
labels must be 0 or 1. A bad
row either raises ``ValueError`` naming the file, line, column, value and what is allowed,
or (``on_bad_row="skip"``) is marked so the caller can drop and count it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ssl_rec.data.raw import RawBatch
from ssl_rec.data.reading import prefetch

ON_BAD_ROW = ("raise", "skip")
DENSE_TRANSFORMS = ("log1p", "signed_log1p", "none")
_NUMBER = r"^\s*[-+]?((\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|nan|inf|infinity)\s*$"


def check_dense_transform(value: str) -> str:
    """Return ``value`` if it names a dense transform, else raise ``ValueError``."""
    if value not in DENSE_TRANSFORMS:
        raise ValueError(f"dense_transform must be one of {DENSE_TRANSFORMS}, got {value!r}")
    return value


def check_on_bad_row(value: str) -> str:
    """Return ``value`` if it is a valid ``on_bad_row`` policy, else raise ``ValueError``."""
    if value not in ON_BAD_ROW:
        raise ValueError(f"on_bad_row must be one of {ON_BAD_ROW}, got {value!r}")
    return value


@dataclass(frozen=True)
class Origin:
    """Where a table's rows came from, to name them in errors.

    Args:
        path: source file.
        first_line: line (or row) number of the table's row 0: 1 without a header, 2 with.
        unit: ``"line"`` for text files, ``"row"`` for Parquet.

    """

    path: str
    first_line: int = 1
    unit: str = "line"

    def where(self, row: int) -> str:
        """``"<path>, line <n>"`` for 0-based ``row``."""
        return f"{self.path}, {self.unit} {self.first_line + int(row)}"


def _as_chunked(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray:
    return column if isinstance(column, pa.ChunkedArray) else pa.chunked_array([column])


def to_float(
    column: pa.ChunkedArray, name: str, origin: Origin, skip: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parse a column as float64; non-numeric text raises or is marked bad.

    Returns:
        ``(values float64[N] with nulls as 0, is_null bool[N], bad bool[N])``.

    """
    column = _as_chunked(column)
    bad = np.zeros(len(column), bool)
    try:
        floats = pc.cast(column, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        text = pc.cast(column, pa.string())
        invalid = pc.invert(pc.match_substring_regex(text, _NUMBER, ignore_case=True))
        bad = pc.fill_null(invalid, False).to_numpy(zero_copy_only=False)
        if not skip:
            row = int(np.argmax(bad))
            raise ValueError(
                f"{origin.where(row)}: column {name!r} must be a number, got "
                f"{text[row].as_py()!r} (cells in preprocess.missing_values are missing)"
            ) from None
        floats = pc.cast(pc.if_else(pa.chunked_array([bad]), None, text), pa.float64())
    is_null = pc.is_null(floats).to_numpy(zero_copy_only=False)
    values = pc.fill_null(floats, 0.0).to_numpy(zero_copy_only=False)
    return values, is_null, bad


def parse_dense(
    columns: list[pa.ChunkedArray],
    names: list[str],
    origin: Origin,
    skip: bool,
    transform: str = "log1p",
) -> tuple[np.ndarray, np.ndarray]:
    """Validate and transform dense columns.

    Args:
        columns: ``n_dense`` columns of length ``N`` (numbers or numeric text; null = missing).
        names: their names, for errors.
        origin: where row 0 came from.
        skip: mark bad rows instead of raising.
        transform: ``"log1p"``: ``log1p(max(x, 0))``, negative values become 0;
            ``"signed_log1p"``: ``sign(x) log1p(|x|)``, the same for ``x >= 0``; ``"none"``:
            ``x``.

    Returns:
        ``(dense float32[N, n_dense], bad bool[N])``, missing -> 0.

    """
    n = len(columns[0]) if columns else 0
    out = np.zeros((n, len(columns)), np.float32)
    bad = np.zeros(n, bool)
    for j, (column, name) in enumerate(zip(columns, names, strict=True)):
        values, _, col_bad = to_float(column, name, origin, skip)
        nonfinite = ~np.isfinite(values)
        if nonfinite.any() and not skip:
            row = int(np.argmax(nonfinite))
            hint = ' (preprocess.missing_values: ["", "nan"] reads NaN as missing)'
            raise ValueError(
                f"{origin.where(row)}: column {name!r} must be finite, got {values[row]}"
                + (hint if np.isnan(values[row]) else "")
            )
        bad |= col_bad | nonfinite
        out[:, j] = transformed(np.where(nonfinite, 0.0, values), transform)
    return out, bad


def transformed(values: np.ndarray, transform: str) -> np.ndarray:
    """Finite ``values`` after ``transform`` (:data:`DENSE_TRANSFORMS`, see :func:`parse_dense`)."""
    if transform == "none":
        return values
    if transform == "signed_log1p":
        return np.sign(values) * np.log1p(np.abs(values))
    return np.log1p(np.maximum(values, 0.0))


def parse_label(
    column: pa.ChunkedArray, name: str, origin: Origin, skip: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Validate a binary label column: 0 / 1, or ``true`` / ``false`` in any case.

    ``True`` / ``False`` is how pandas writes a boolean column to CSV.

    Returns:
        ``(label float32[N] in {0, 1}, bad bool[N])``; missing or other values are bad.

    """
    column = _as_chunked(column)
    values, is_null, bad = to_float(_booleans_as_digits(column), name, origin, skip=True)
    invalid = bad | is_null | ((values != 0.0) & (values != 1.0))
    if invalid.any() and not skip:
        row = int(np.argmax(invalid))
        got = "a missing value" if is_null[row] and not bad[row] else repr(column[row].as_py())
        raise ValueError(
            f"{origin.where(row)}: label {name!r} must be 0 or 1 (or true / false), got {got}"
        )
    return values.astype(np.float32), invalid


def _booleans_as_digits(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A text column's ``true`` / ``false`` cells (any case, spaces around) as ``1`` / ``0``."""
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return column
    word = pc.utf8_lower(pc.utf8_trim_whitespace(column))
    digits = pc.if_else(pc.equal(word, "false"), "0", column)
    return pc.if_else(pc.equal(word, "true"), "1", digits)


def as_strings(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """One ``string`` (or string-dictionary) array of a column (integers as their text)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type) and column.type.value_type == pa.string():
        return column
    return column if column.type == pa.string() else pc.cast(column, pa.string())


class RowValidator:
    """Turns record batches into :class:`RawBatch` es: checks numbers and labels per batch.

    Args:
        source: yields ``(record batch, line or row number of its row 0)`` and has
            ``path``, ``skipped`` (rows it dropped) and ``position()``.
        dense: dense column names.
        categorical: categorical column names.
        label: label column name, or ``None`` for unlabeled data.
        skip: drop and count bad rows instead of raising ``ValueError``.
        unit: ``"line"`` (text) or ``"row"`` (Parquet), for error messages.
        dense_transform: what dense values become (:func:`parse_dense`'s ``transform``).

    """

    def __init__(
        self,
        source: Any,
        dense: list[str],
        categorical: list[str],
        label: str | None,
        skip: bool,
        unit: str = "line",
        dense_transform: str = "log1p",
    ) -> None:
        self.source, self.dense, self.categorical = source, dense, categorical
        self.label, self.skip, self.unit = label, skip, unit
        self.dense_transform = check_dense_transform(dense_transform)

    @property
    def path(self) -> str:
        """The file being read."""
        return str(self.source.path)

    def position(self) -> int:
        """Bytes of the file consumed so far."""
        return self.source.position()

    def _parsed(self) -> Iterator[tuple[pa.RecordBatch, int, int]]:
        """``(batch, first line, rows skipped so far)``, read as the batch is parsed."""
        for batch, first in self.source:
            yield batch, first, self.source.skipped

    def __iter__(self) -> Iterator[RawBatch]:
        """Yield the validated batches of the file; bad rows raise or are dropped.

        The file is parsed on a reader thread (Arrow's parser releases the GIL) one batch
        ahead of the validation here.
        """
        reported = 0
        for batch, first, skipped in prefetch(self._parsed(), depth=1):
            origin = Origin(self.path, first, self.unit)
            dense, bad = parse_dense([batch.column(n) for n in self.dense], self.dense, origin,
                                     self.skip, self.dense_transform)  # fmt: skip
            label = None
            if self.label is not None:
                label, bad_label = parse_label(batch.column(self.label), self.label, origin,
                                               self.skip)  # fmt: skip
                bad |= bad_label
            cats = [as_strings(batch.column(n)) for n in self.categorical]
            dropped, reported = skipped - reported, skipped
            raw = RawBatch(dense, cats, label, dropped + int(bad.sum()))
            yield raw.take(~bad) if bad.any() else raw
