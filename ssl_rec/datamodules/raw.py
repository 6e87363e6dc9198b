"""Validated raw rows of one input file, before ids are assigned."""

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


@dataclass(frozen=True)
class RawPart:
    """One file's rows after validation; categorical values still raw strings.

    Args:
        dense: ``float32[N, n_dense]`` already transformed (``log1p(max(x, 0))``, missing 0).
        categorical: ``F`` coded columns of length ``N``.
        label: ``float32[N]`` in {0, 1}, or ``None`` for an unlabeled file.
        skipped: rows dropped by ``on_bad_row="skip"``.
        source: the file the rows came from.

    """

    dense: np.ndarray
    categorical: list[CodedColumn]
    label: np.ndarray | None
    skipped: int
    source: str

    @property
    def num_rows(self) -> int:
        """Number of rows ``N``."""
        return int(self.dense.shape[0])

    def take(self, mask: np.ndarray) -> RawPart:
        """Rows where ``mask bool[N]`` is true (same ``skipped`` and ``source``)."""
        return RawPart(
            self.dense[mask],
            [CodedColumn(c.dictionary, c.codes[mask]) for c in self.categorical],
            None if self.label is None else self.label[mask],
            self.skipped,
            self.source,
        )
