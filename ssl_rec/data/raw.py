"""Validated raw rows of one input file, before ids are assigned."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ssl_rec.vocabulary import CodedColumn


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
