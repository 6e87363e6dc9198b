""":class:`Retriever`: the top-K items of raw query rows from a retrieval export alone.

``Retriever.load(DIR)`` opens an :func:`~ssl_rec.evaluation.retrieval_export.export_retrieval`
directory, checking every file against the manifest's CRC-32 (``SSL_REC_VERIFY=0`` skips the
check); ``topk(rows, k)`` takes rows of raw values (a ``pyarrow.Table`` or a mapping of
column -> values, as in the user's table), encodes them with the exported vocabularies and
standardisation, runs the query tower and searches the FAISS item index.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from functools import cached_property, partial
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ssl_rec._io import verify_file
from ssl_rec.evaluation.faiss_index import set_search_params
from ssl_rec.evaluation.retrieval_export import (
    IDS,
    INDEX,
    KEYS,
    MANIFEST,
    QUERY_TOWER,
    checked_manifest,
)
from ssl_rec.models.backbone import Backbone
from ssl_rec.models.two_tower import TowerEncoder, tower_schema
from ssl_rec.schema import FeatureSchema
from ssl_rec.types import Batch
from ssl_rec.vocab import CodedColumn, Vocabularies

Rows = pa.Table | Mapping[str, Sequence[Any]]
REMEDY = "export the model again"


class Retriever:
    """A query tower, the item index and what raw values mean: ``topk(rows, k)`` per row.

    Build it with :meth:`load`.

    Attributes:
        schema: the training data's schema (query rows are encoded into it).
        query_tower: the ``Backbone`` of the query columns, in eval mode.
        index: the FAISS inner-product index of the catalogue (id ``i`` = row ``i``).
        item_ids: ``int64[N]`` item id of each catalogue row.
        item_keys: ``str[N]`` raw key of each catalogue row.
        vocabulary: raw value -> id of each categorical column, or ``None`` (rows hold ids).
        dense_scaling: ``column -> (mean, std)`` of the standardised numeric columns.

    """

    def __init__(
        self,
        schema: FeatureSchema,
        query_tower: Backbone,
        index: faiss.Index,
        item_ids: np.ndarray,
        item_keys: np.ndarray,
        vocabulary: Vocabularies | None = None,
        dense_scaling: Mapping[str, Sequence[float]] | None = None,
    ) -> None:
        self.schema, self.query_tower, self.index = schema, query_tower.eval(), index
        self.item_ids, self.item_keys = np.asarray(item_ids, np.int64), np.asarray(item_keys)
        self.vocabulary = vocabulary
        scaling = dense_scaling or {}
        self.dense_scaling = {k: (float(v[0]), float(v[1])) for k, v in scaling.items()}
        # item id -> catalogue row (-1: none), as ItemCatalogue.rows_of: one lookup per batch
        self._row_of_id = np.full(int(self.item_ids.max(initial=-1)) + 1, -1, np.int64)
        valid = self.item_ids >= 0
        self._row_of_id[self.item_ids[valid]] = np.flatnonzero(valid)
        names = query_tower.schema
        self._sparse = torch.tensor([schema.field_index(n) for n in names.field_names])
        self._dense = torch.tensor([list(schema.dense).index(n) for n in names.dense],
                                   dtype=torch.long)  # fmt: skip

    def __len__(self) -> int:
        """``N``, the number of catalogue items."""
        return len(self.item_ids)

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Retriever:
        """Open an export directory, each file checked against its recorded CRC-32.

        Raises:
            ValueError: naming the file when it is not such a directory, is inconsistent or
                its bytes changed (:class:`~ssl_rec._io.ChecksumError`).
            FileNotFoundError: a file the manifest lists is missing.

        """
        root = Path(directory)
        where = root / MANIFEST
        try:
            manifest = json.loads(where.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{where}: not a retrieval export ({e})") from e
        manifest = checked_manifest(manifest, where)
        sums = manifest["checksums"]

        def checked(name: str) -> Path:
            verify_file(root / name, sums[name], REMEDY)
            return root / name

        schema = FeatureSchema.from_dict(manifest["schema"])
        query = tower_schema(schema, manifest["query_fields"], "query")
        encoder = partial(TowerEncoder, hidden=manifest["hidden"],
                          output_dim=manifest["output_dim"])  # fmt: skip
        tower = Backbone(query, manifest["embedding_dim"], encoder=encoder)
        state = torch.load(checked(QUERY_TOWER), map_location="cpu", weights_only=True)
        tower.load_weights(state, str(root / QUERY_TOWER))
        index = faiss.read_index(str(checked(INDEX)))
        set_search_params(index, manifest["index"].get("search_params", {}))
        ids = np.load(checked(IDS), allow_pickle=False)
        keys = np.load(checked(KEYS), allow_pickle=False)
        vocabulary = None
        if manifest.get("vocabulary"):
            vocabulary = Vocabularies.load(checked(manifest["vocabulary"]))
            vocabulary.check_schema(schema, str(root / manifest["vocabulary"]))
        n, dim = manifest["n_items"], manifest["output_dim"]
        if (index.ntotal, index.d) != (n, dim) or ids.shape != (n,) or keys.shape != (n,):
            raise ValueError(
                f"{root}: index {index.ntotal} x {index.d}, {ids.shape[0]} ids and "
                f"{keys.shape[0]} keys do not match the manifest's {n} x {dim}"
            )
        return cls(schema, tower, index, ids, keys, vocabulary, manifest["dense_scaling"])

    @property
    def query_fields(self) -> list[str]:
        """The columns a query row must hold (categorical, then numeric)."""
        tower = self.query_tower.schema
        return [*tower.field_names, *tower.dense]

    def encode(self, rows: Rows) -> tuple[Batch, int]:
        """Full-schema ``Batch`` of raw ``rows``, and how many values were unknown.

        Categorical query columns are encoded with the vocabulary (a value never seen in
        training gets id 0, like a missing one); without a vocabulary they must hold ids.
        Numeric columns are standardised as in training (a missing value becomes 0, the mean).
        The other columns of the schema stay 0.

        Raises:
            ValueError: naming the column when one is missing or holds what cannot be encoded.

        """
        table = rows if isinstance(rows, pa.Table) else pa.table(dict(rows))
        n, unknown = table.num_rows, 0
        sparse = torch.zeros(n, self.schema.n_fields, dtype=torch.long)
        dense = torch.zeros(n, len(self.schema.dense))
        tower = self.query_tower.schema
        for name in tower.field_names:
            column = _column(table, name)
            if self.vocabulary is None:
                ids = _ids(column, name, self.schema.field(name).cardinality)
            else:
                text = pc.cast(column, pa.string())
                ids = self.vocabulary[name].encode(CodedColumn.from_column(text)).astype(np.int64)
                given = pc.is_valid(text).to_numpy(zero_copy_only=False)
                unknown += int(((ids == 0) & given).sum())
            sparse[:, self.schema.field_index(name)] = torch.from_numpy(ids)
        for name in tower.dense:
            column = _column(table, name)
            try:
                x = pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise ValueError(f"column {name!r} of type {column.type} is not numeric") from None
            mean, std = self.dense_scaling.get(name, (0.0, 1.0))
            scaled = np.nan_to_num((x - mean) / std, nan=0.0).astype(np.float32)
            dense[:, list(self.schema.dense).index(name)] = torch.from_numpy(scaled)
        return Batch(dense, sparse), unknown

    def topk(
        self, rows: Rows, k: int, exclude: Sequence[Sequence[Any] | None] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best items of each raw row: ``(scores float32[B, k], keys [B, k])``.

        Args:
            rows: ``B`` rows of raw values holding :attr:`query_fields`.
            k: items per row, ``1..N``.
            exclude: per row, raw item keys never to return (its history); keys outside the
                catalogue are ignored. A row left with fewer than ``k`` items ends with key
                ``None`` and score ``-inf``.

        """
        batch, _ = self.encode(rows)
        rows_out = None
        if exclude is not None:
            rows_out = [self.rows_of_keys(seen or []) for seen in exclude]
        scores, positions = self.search(batch, k, rows_out)
        keys = np.empty(positions.shape, dtype=object)
        found = positions >= 0
        keys[found] = self.item_keys[positions[found]]
        return scores, keys

    def topk_ids(
        self, batch: Batch, k: int, exclude: Sequence[Sequence[int] | torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`topk` on encoded rows: ``(scores float32[B, k], item_ids int64[B, k])``.

        ``batch`` holds every column of :attr:`schema` as ids (the item columns are ignored);
        ``exclude`` lists item ids per row; a short row is padded with id ``-1``.
        """
        rows_out = None
        if exclude is not None:
            rows_out = [self.rows_of_ids(seen) for seen in exclude]
        scores, positions = self.search(batch, k, rows_out)
        ids = np.where(positions >= 0, self.item_ids[np.maximum(positions, 0)], -1)
        return torch.from_numpy(scores), torch.from_numpy(ids)

    @torch.no_grad()
    def query_vectors(self, batch: Batch) -> np.ndarray:
        """``float32[B, H]`` unit query vectors of a full-schema ``batch`` of ids."""
        query = Batch(batch.dense[:, self._dense], batch.sparse[:, self._sparse])
        return np.ascontiguousarray(self.query_tower(query).pooled.float().numpy())

    def search(
        self, batch: Batch, k: int, exclude_rows: Sequence[np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(scores float32[B, k], catalogue rows int64[B, k])`` by inner product, best first.

        ``exclude_rows`` lists per batch row the catalogue rows to leave out; rows the
        search cannot fill hold ``-1`` with score ``-inf``.
        """
        if not 1 <= k <= len(self):
            raise ValueError(f"Retriever.topk: k={k} must be in 1..{len(self)}")
        queries = self.query_vectors(batch)
        if exclude_rows is not None and len(exclude_rows) != len(queries):
            raise ValueError(
                f"Retriever.topk: exclude has {len(exclude_rows)} rows, the batch {len(queries)}"
            )
        extra = max((len(r) for r in exclude_rows), default=0) if exclude_rows else 0
        scores, positions = self.index.search(queries, min(len(self), k + extra))
        keep = positions >= 0
        for row, out in enumerate(exclude_rows or []):
            if len(out):
                keep[row] &= ~np.isin(positions[row], out)
        order = np.argsort(~keep, axis=1, kind="stable")[:, :k]  # kept first, in rank order
        positions = np.take_along_axis(np.where(keep, positions, -1), order, 1)
        scores = np.take_along_axis(np.where(keep, scores, -np.inf), order, 1)
        return scores.astype(np.float32), positions.astype(np.int64)

    def rows_of_keys(self, keys: Sequence[Any]) -> np.ndarray:
        """``int64[m]`` catalogue rows of the raw item ``keys`` found (compared as text)."""
        found = [self._row_of_key.get(str(key)) for key in keys]
        return np.array([r for r in found if r is not None], dtype=np.int64)

    @cached_property
    def _row_of_key(self) -> dict[str, int]:
        """Raw item key -> catalogue row, built on the first exclusion by key."""
        return {str(key): row for row, key in enumerate(self.item_keys.tolist())}

    def rows_of_ids(self, ids: Sequence[int] | torch.Tensor) -> np.ndarray:
        """``int64[m]`` catalogue rows of the item ``ids`` found."""
        ids = torch.as_tensor(ids).reshape(-1).long().cpu().numpy()
        inside = (ids >= 0) & (ids < len(self._row_of_id))
        rows = self._row_of_id[ids[inside]]
        return rows[rows >= 0]


def _column(table: pa.Table, name: str) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise ValueError(
            f"no column {name!r}, a query column of the export (columns: {table.column_names})"
        )
    return table.column(name)


def _ids(column: pa.ChunkedArray, name: str, cardinality: int) -> np.ndarray:
    """An id column of an export without vocabularies, checked against the field's size."""
    if column.null_count:
        raise ValueError(f"column {name!r} has {column.null_count} empty cells")
    try:
        ids = pc.cast(column, pa.int64()).to_numpy().copy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise ValueError(
            f"column {name!r} of type {column.type} is not int64 (this export has no "
            "vocabulary: it knows ids, not raw values)"
        ) from None
    bad = (ids < 0) | (ids >= cardinality)
    if bad.any():
        raise ValueError(
            f"column {name!r} holds id {int(ids[bad][0])}, not in the export's "
            f"0..{cardinality - 1} (this export has no vocabulary: it knows ids, not raw values)"
        )
    return ids
