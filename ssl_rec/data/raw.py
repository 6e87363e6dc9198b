"""Validated raw rows before ids are assigned: one batch (streaming) or one whole file."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ssl_rec.vocab import CodedColumn


@dataclass(frozen=True)
class RawBatch:
    """A batch of validated rows; categorical values still raw strings.

    Args:
        dense: ``float32[N, n_dense]`` as the reader transformed them (missing 0).
        categorical: ``F`` string arrays of length ``N`` (null = missing).
        label: ``float32[N]`` in {0, 1}, or ``None`` for an unlabeled file.
        skipped: bad rows dropped while reading this batch (``on_bad_row="skip"``).

    """

    dense: np.ndarray
    categorical: list[pa.Array]
    label: np.ndarray | None
    skipped: int = 0

    @property
    def num_rows(self) -> int:
        """Number of rows ``N``."""
        return int(self.dense.shape[0])

    def encoded(self) -> RawBatch:
        """The same rows with each categorical column dictionary-encoded (distinct + indices)."""
        cats = [c if pa.types.is_dictionary(c.type) else pc.dictionary_encode(c)
                for c in self.categorical]  # fmt: skip
        return RawBatch(self.dense, cats, self.label, self.skipped)

    def take(self, mask: np.ndarray) -> RawBatch:
        """Rows where ``mask bool[N]`` is true (same ``skipped``)."""
        keep = pa.array(mask)
        return RawBatch(
            self.dense[mask],
            [c.filter(keep) for c in self.categorical],
            None if self.label is None else self.label[mask],
            self.skipped,
        )


@dataclass(frozen=True)
class RawPart:
    """One file's rows after validation; categorical values dictionary-encoded.

    Args:
        dense: ``float32[N, n_dense]`` as the reader transformed them (missing 0).
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

    @classmethod
    def from_batches(cls, batches: list[RawBatch], n_dense: int, source: str) -> RawPart:
        """Concatenate a file's batches (the whole file in memory)."""
        n_fields = len(batches[0].categorical) if batches else 0
        labels = [b.label for b in batches if b.label is not None]
        return cls(
            np.concatenate([b.dense for b in batches]) if batches else np.zeros((0, n_dense)),
            [
                CodedColumn.from_column(pa.chunked_array([b.categorical[f] for b in batches]))
                for f in range(n_fields)
            ],
            np.concatenate(labels) if labels and len(labels) == len(batches) else None,
            sum(b.skipped for b in batches),
            source,
        )

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
