"""A table of (user, item) interactions as a retrieval task: which items will a user like next?

The user's own table (``.parquet``, ``.csv`` or ``.tsv``), read whole into memory: one row
per interaction, a user column, an item column, optional categorical context / user / item
columns, optional numeric columns and optional label and time columns. A row is a positive
when it has no label column or its label is at least ``threshold``. Rows are taken in
``time`` order (file order without one); each user's last positive goes to test, the one
before it to validation and the others to training (users with fewer than 3 positives keep
them all in training); ``holdout`` holds out a share of each user's positives instead. Every
categorical value gets an id ``1..n`` in sorted order of its text (0 = missing); the numeric
columns are standardised with their mean and standard deviation. The vocabularies and the
standardisation travel with a retrieval export, so a served model takes raw values. See
``docs/retrieval.md``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from ssl_rec._checks import check_at_least
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch
from ssl_rec.vocab import MISSING_VALUE, Vocabularies

_SPLIT_CODES = {"train": 0, "val": 1, "test": 2}  # leave_last_out's split of a row


def encode_column(values: np.ndarray) -> tuple[np.ndarray, int]:
    """String values to ids ``1..n`` in sorted order: ``(int64[N] ids, cardinality n + 1)``."""
    vocabulary, ids = np.unique(values, return_inverse=True)
    return ids.astype(np.int64) + 1, len(vocabulary) + 1


MAX_HOLDOUT = 0.4  # test and validation together hold out at most 80% of a user's positives


def check_holdout(owner: str, key: str, value: float) -> float:
    """``value`` as a float in ``[0, MAX_HOLDOUT]``, else ``ValueError`` naming ``owner.key``.

    The value is a share of each user's positives held out for test, and as many for
    validation.
    """
    value = float(value)
    if not 0.0 <= value <= MAX_HOLDOUT:
        raise ValueError(f"{owner}.{key}={value} must be in [0, {MAX_HOLDOUT}] (a share of "
                         "each user's positives)")  # fmt: skip
    return value


def leave_last_out(users: np.ndarray, positive: np.ndarray, fraction: float = 0.0) -> np.ndarray:
    """Split of time-ordered rows: 0 train, 1 validation, 2 test, per user's positives.

    Each user's last ``h`` positives go to test and the ``h`` before them to validation, with
    ``h = max(1, round(fraction * p))`` for a user of ``p`` positives (``fraction = 0``: the
    last positive is test, the one before it validation), at most ``(p - 1) // 2``, so at
    least one positive of every user stays in training. Evaluation on several held-out
    positives per user measures a model on more of its users' items: on MovieLens-100k a
    tenth per user holds out 5,552 positives instead of 942.

    Args:
        users: ``int64[N]`` user of each row, rows in time order.
        positive: ``bool[N]`` whether the row is a positive.
        fraction: share of each user's positives held out for test, and as many for
            validation, in ``[0, 0.4]``.

    Returns:
        ``int8[N]``; negatives are always 0, and users with fewer than 3 positives keep all
        their rows in training.

    Example:
        >>> leave_last_out(np.array([1, 1, 1, 1, 1]), np.ones(5, bool)).tolist()
        [0, 0, 0, 1, 2]
        >>> leave_last_out(np.array([1, 1, 1, 1, 1]), np.ones(5, bool), 0.4).tolist()
        [0, 1, 1, 2, 2]

    """
    fraction = check_holdout("leave_last_out", "fraction", fraction)
    split = np.zeros(len(users), dtype=np.int8)
    rows = np.flatnonzero(positive)
    order = rows[np.argsort(users[rows], kind="stable")]  # by user, then time
    _, start, counts = np.unique(users[order], return_index=True, return_counts=True)
    for first, count in zip(start, counts, strict=True):
        if count >= 3:
            held = max(1, min(round(fraction * count), (count - 1) // 2))
            end = first + count
            split[order[end - held : end]] = 2
            split[order[end - 2 * held : end - held]] = 1
    return split


def read_interactions(path: str, what: str = "interaction table") -> pa.Table:
    """The whole table of a ``.parquet``, ``.csv`` or ``.tsv`` file (one sentence if not).

    ``what`` names the file in the message when it does not exist.
    """
    suffix = Path(path).suffix.lower()
    if suffix not in (".parquet", ".pq", ".csv", ".tsv"):
        raise ValueError(f"{path}: unknown suffix {suffix!r}; use .parquet, .csv or .tsv")
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such {what}")
    try:
        if suffix in (".parquet", ".pq"):
            return pq.read_table(path)
        options = pacsv.ParseOptions(delimiter="," if suffix == ".csv" else "\t")
        return pacsv.read_csv(path, parse_options=options)
    except pa.ArrowException as e:
        raise ValueError(f"{path}: cannot be read as {suffix[1:]} ({e})") from None


def text_column(table: pa.Table, name: str) -> np.ndarray:
    """Column ``name`` as text, ``None`` where missing: ``object[N]``."""
    return np.asarray(pc.cast(table.column(name), pa.string()).to_pylist(), dtype=object)


class InteractionTableDataModule(pl.LightningDataModule):
    """Positive interactions as rows of every column; see the module docstring.

    Batches hold every column of :attr:`schema` (no label); a two-tower model reads its
    query and item columns from them. Besides the loaders it gives what ranking needs:
    :meth:`catalogue` (one row per item), :meth:`history` (each user's items outside
    validation and test, excluded from its ranking), :meth:`train_positives` (for item
    popularity), and what serving needs: :attr:`vocabulary` (raw value -> id) and
    :attr:`dense_scaling` (mean and standard deviation of each numeric column).

    Args:
        path: the interaction table (``.parquet``, ``.csv`` or ``.tsv``).
        user: the user column.
        item: the item column.
        categorical: every categorical column (default ``[user, item]``; the user and item
            columns are added when left out), in the schema's order.
        dense: numeric columns, standardised.
        item_columns: the columns that describe an item (default ``[item]``); a catalogue row
            holds them (from the item's first row) and zeros elsewhere.
        label: a numeric column; rows with ``label >= threshold`` are positives (default:
            every row is one).
        threshold: see ``label``.
        time: a column the rows are ordered by (stable); default the file's order.
        holdout: share of each user's positives held out for test, and as many for
            validation (:func:`leave_last_out`); 0, the default, holds out the last one each.
        batch_size: positive pairs per training batch.
        eval_batch_size: rows per validation/test batch (default ``batch_size``).
        seed: shuffle seed.
        cache_dir: accepted like the other data modules' option; unused (the table is read
            and encoded in memory).

    Example:
        >>> dm = InteractionTableDataModule("views.parquet", "user", "item",
        ...                                 ["user", "item", "device"])  # doctest: +SKIP

    """

    source_name = "interaction_table"

    def __init__(
        self,
        path: str | None = None,
        user: str = "user_id",
        item: str = "item_id",
        categorical: Sequence[str] | None = None,
        dense: Sequence[str] | None = None,
        item_columns: Sequence[str] | None = None,
        label: str | None = None,
        threshold: float = 1.0,
        time: str | None = None,
        holdout: float = 0.0,
        batch_size: int = 512,
        eval_batch_size: int | None = None,
        seed: int = 0,
        cache_dir: str | None = None,
    ) -> None:
        init_locals = dict(locals())
        super().__init__()
        owner = type(self).__name__
        self.batch_size = check_at_least(owner, "batch_size", batch_size)
        self.eval_batch_size = check_at_least(
            owner, "eval_batch_size", eval_batch_size or batch_size
        )
        self.seed = int(seed)
        self.holdout = check_holdout(owner, "holdout", holdout)
        if type(self) is InteractionTableDataModule:
            self.record_hparams(init_locals)
        self.user, self.item = user, item
        categorical = list(categorical or [])
        categorical += [c for c in (user, item) if c not in categorical]
        dense = list(dense or [])
        item_columns = list(item_columns or [item])
        table = self.read_table(path)
        wanted = [*categorical, *dense, *([label] if label else []), *([time] if time else [])]
        missing = [c for c in wanted if c not in table.column_names]
        if missing:
            raise ValueError(f"{path}: no columns {missing} (columns: {table.column_names})")
        stray = [c for c in item_columns if c not in categorical and c not in dense]
        if stray or item not in item_columns:
            raise ValueError(f"{owner}.item_columns={item_columns} must hold {item!r} and only "
                             f"categorical or dense columns")  # fmt: skip
        if time:
            table = table.take(pc.sort_indices(table, [(time, "ascending")]))
        self._load(table, categorical, dense, item_columns, label, float(threshold))

    def record_hparams(self, init_locals: dict[str, Any]) -> None:
        """Save the constructor arguments, ``_class_path`` first and ``path`` made absolute.

        So ``ssl-rec export`` rebuilds the data module from a checkpoint alone, from any
        working directory (LightningCLI's ``_class_path`` convention).
        """
        cls = type(self)
        hparams: dict[str, Any] = {"_class_path": f"{cls.__module__}.{cls.__qualname__}"}
        hparams |= {k: v for k, v in init_locals.items() if k not in ("self", "__class__")}
        path = hparams.get("path")
        if isinstance(path, str) and os.path.exists(path):
            hparams["path"] = os.path.abspath(path)
        self.save_hyperparameters(hparams)

    def read_table(self, path: str | None) -> pa.Table:
        """The interactions, in time order unless a ``time`` column sorts them."""
        if path is None:
            raise ValueError(f"{type(self).__name__} needs --data.path (the interaction table)")
        return read_interactions(path)

    def _load(
        self, table: pa.Table, categorical: list[str], dense: list[str], item_columns: list[str],
        label: str | None, threshold: float,
    ) -> None:  # fmt: skip
        columns, fields, values = [], [], {}
        for name in categorical:
            text = text_column(table, name)
            present = np.array([v is not None for v in text])
            ids = np.zeros(len(text), dtype=np.int64)
            vocabulary, inverse = np.unique(text[present].astype(str), return_inverse=True)
            ids[present] = inverse + 1  # encode_column's ids, with the vocabulary kept
            columns.append(ids)
            fields.append(CategoricalField(name, len(vocabulary) + 1))
            values[name] = pa.array([MISSING_VALUE, *vocabulary.tolist()], pa.string())
        self._sparse = torch.from_numpy(np.stack(columns, 1))
        self._vocabulary = Vocabularies.from_id_values(values)
        scaled, self._dense_scaling = [], {}
        for name in dense:
            x = pc.cast(table.column(name), pa.float64()).to_numpy(zero_copy_only=False)
            mean = float(np.nanmean(x)) if np.isfinite(x).any() else 0.0
            std = float(np.nanstd(x)) if np.isfinite(x).any() else 1.0
            std = std if std > 0 else 1.0
            scaled.append(np.nan_to_num((x - mean) / std, nan=0.0).astype(np.float32))
            self._dense_scaling[name] = (mean, std)
        n = table.num_rows
        self._dense = torch.from_numpy(np.stack(scaled, 1) if scaled else np.zeros((n, 0), "f4"))
        self._schema = FeatureSchema(dense, fields, None, {"source": self.source_name})
        self._item_columns = item_columns
        positive = np.ones(n, dtype=bool)
        if label is not None:
            y = pc.cast(table.column(label), pa.float64()).to_numpy(zero_copy_only=False)
            positive = np.nan_to_num(y, nan=-np.inf) >= threshold
        users = self._sparse[:, self._schema.field_index(self.user)].numpy()
        self._split = leave_last_out(users, positive, self.holdout)
        self._positive = positive

    @property
    def schema(self) -> FeatureSchema:
        """Columns of the batches: the dense ones (standardised), then the categorical ones."""
        return self._schema

    @property
    def vocabulary(self) -> Vocabularies:
        """Raw value of every id of every categorical column (id 0 = missing)."""
        return self._vocabulary

    @property
    def dense_scaling(self) -> dict[str, tuple[float, float]]:
        """``column -> (mean, std)``: a raw value ``x`` becomes ``(x - mean) / std``."""
        return dict(self._dense_scaling)

    def _rows(self, split: int) -> torch.Tensor:
        return torch.from_numpy(np.flatnonzero((self._split == split) & self._positive))

    def _pairs(self, rows: torch.Tensor) -> torch.Tensor:
        cols = [self._schema.field_index(self.user), self._schema.field_index(self.item)]
        return self._sparse[rows][:, cols]

    def catalogue(self) -> Batch:
        """One row per item (sorted by id) with its item columns; the other columns are 0."""
        sparse_cols = [self._schema.field_index(c) for c in self._item_columns
                       if c in self._schema.field_names]  # fmt: skip
        dense_cols = [list(self._schema.dense).index(c) for c in self._item_columns
                      if c in self._schema.dense]  # fmt: skip
        ids = self._sparse[:, self._schema.field_index(self.item)]
        first = torch.zeros(int(ids.max()) + 1, dtype=torch.long)
        first[ids.flip(0)] = torch.arange(len(ids) - 1, -1, -1)  # first row of each item
        items = torch.unique(ids[ids > 0])
        sparse = torch.zeros(len(items), self._schema.n_fields, dtype=torch.long)
        sparse[:, sparse_cols] = self._sparse[first[items]][:, sparse_cols]
        dense = torch.zeros(len(items), len(self._schema.dense))
        dense[:, dense_cols] = self._dense[first[items]][:, dense_cols]
        return Batch(dense, sparse)

    def history(self) -> torch.Tensor:
        """``int64[P, 2]`` ``(user id, item id)`` of every interaction outside validation/test."""
        held_out = (self._split > 0) & self._positive
        return self._pairs(torch.from_numpy(np.flatnonzero(~held_out)))

    def train_positives(self) -> torch.Tensor:
        """``int64[P, 2]`` ``(user id, item id)`` of the training positives."""
        return self.split_positives("train")

    def split_positives(self, split: str) -> torch.Tensor:
        """``int64[P, 2]`` ``(user id, item id)`` of ``train``, ``val`` or ``test`` positives."""
        return self._pairs(self._rows(_SPLIT_CODES[split]))

    def _loader(self, rows: torch.Tensor, batch_size: int, shuffle: bool) -> DataLoader:
        g = torch.Generator().manual_seed(self.seed)
        return DataLoader(rows, batch_size=batch_size, shuffle=shuffle, generator=g,
                          collate_fn=self._batch)  # fmt: skip

    def _batch(self, rows: list[torch.Tensor]) -> Batch:
        index = torch.stack(rows)
        return Batch(self._dense[index], self._sparse[index])

    def rows(self, split: str) -> Batch:
        """Every positive row of ``train``, ``val`` or ``test`` as one batch."""
        index = self._rows(_SPLIT_CODES[split])
        return Batch(self._dense[index], self._sparse[index])

    def train_dataloader(self) -> DataLoader:
        """Shuffled training positives."""
        return self._loader(self._rows(0), self.batch_size, True)

    def val_dataloader(self) -> DataLoader:
        """The validation positives (each user's second-to-last, or its share)."""
        return self._loader(self._rows(1), self.eval_batch_size, False)

    def test_dataloader(self) -> DataLoader:
        """The test positives (each user's last, or its last share)."""
        return self._loader(self._rows(2), self.eval_batch_size, False)
