"""A categorical column as its distinct raw values plus one code per row, and value counts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class CodedColumn:
    """A categorical column as distinct raw values plus one code per row.

    Args:
        dictionary: distinct raw values (strings), length ``U``.
        codes: ``int32[N]`` index into ``dictionary``, -1 where missing.

    """

    dictionary: pa.Array
    codes: np.ndarray

    @classmethod
    def from_column(cls, column: pa.ChunkedArray | pa.Array) -> CodedColumn:
        """Dictionary-encode a string column in one C++ hash pass."""
        if pa.types.is_dictionary(column.type):
            # Chunks may each carry their own dictionary: back to text, one dictionary.
            column = column.cast(column.type.value_type)
        encoded = pc.dictionary_encode(column)
        if isinstance(encoded, pa.ChunkedArray):
            if encoded.num_chunks == 0:
                return cls(pa.array([], pa.string()), np.zeros(0, np.int32))
            dictionary = encoded.chunk(0).dictionary
            indices = pa.chunked_array([c.indices for c in encoded.chunks], pa.int32())
        else:
            dictionary, indices = encoded.dictionary, encoded.indices
        codes = pc.fill_null(indices, -1).to_numpy().astype(np.int32, copy=False)
        return cls(dictionary, codes)

    def to_pylist(self) -> list[str | None]:
        """Raw value of each row (``None`` = missing); for tests and debugging."""
        values = self.dictionary.to_pylist()
        return [None if c < 0 else values[c] for c in self.codes]


def count_values(column: CodedColumn) -> tuple[pa.Array, np.ndarray]:
    """Count each distinct raw value of a coded column.

    Args:
        column: ``N`` rows as dictionary + codes (-1 = missing).

    Returns:
        ``(distinct, counts)``: string array of length ``U`` and ``int64[U]`` (may hold 0s).

    """
    codes = column.codes[column.codes >= 0]
    return column.dictionary, np.bincount(codes, minlength=len(column.dictionary)).astype(np.int64)


def merge_counts(parts: list[tuple[pa.StringArray, np.ndarray]]) -> tuple[pa.Array, np.ndarray]:
    """Sum value counts of several parts (``group_by`` in Arrow, no Python loop over values)."""
    if len(parts) == 1:
        return parts[0]
    table = pa.table(
        {
            "value": pa.concat_arrays([p[0].cast(pa.string()) for p in parts]),
            "count": pa.array(np.concatenate([p[1] for p in parts])),
        }
    )
    summed = table.group_by("value").aggregate([("count", "sum")])
    return summed.column("value").combine_chunks(), summed.column("count_sum").to_numpy()
