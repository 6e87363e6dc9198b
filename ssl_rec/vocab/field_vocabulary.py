"""The vocabulary of one field: raw categorical values -> contiguous ids, and back.

Id 0 (:data:`~ssl_rec.schema.MISSING_ID`) is reserved for missing, rare (below
``min_frequency``) and unseen values; kept values get ids ``1..n`` in order of decreasing
training frequency (ties by value). A field with more distinct training values than
``max_vocab_size - 1`` is hashed instead, as MLPerf's DLRM caps Criteo Terabyte tables: every
value goes to bucket ``1 + hash(value) % (max_vocab_size - 1)``, so counting such a field
needs no memory per value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ssl_rec.schema import MISSING_ID
from ssl_rec.vocab.coded_column import CodedColumn
from ssl_rec.vocab.strings import frequency_order, hash_strings, hashes_contain

MISSING_VALUE = "<missing>"
UNUSED_VALUE = "<unused>"
HASHED_VALUE = "<hashed>"
# A field's rare training values are remembered (as 8-byte hashes) up to this many, so data
# encoded later can tell "rare in training" from "never seen" without a checkpoint growing
# with Criteo-sized tails (tens of millions of rare values).
RARE_HASHES_MAX = 1 << 16


@dataclass(frozen=True)
class Vocabulary:
    """The kept raw values of one field and the id of each.

    Args:
        values: kept raw values (strings), most frequent first, length ``U`` (empty when
            hashed).
        ids: ``int32[U]`` id of each kept value (``1..U``).
        cardinality: number of ids including the reserved id 0 (at least 2: a field whose
            every value is rare keeps id 0 plus one unused id, so its table still exists).
        hashed: every non-missing value goes to bucket ``1 + hash(value) % (cardinality - 1)``
            (fields with more distinct training values than ``max_vocab_size - 1``).
        rare_count: distinct training values seen fewer than ``min_frequency`` times (they
            map to id 0); ``None`` when not recorded (vocabularies made before it was).
        rare_hashes: sorted ``uint64[rare_count]`` :func:`hash_strings` of those values, or
            ``None`` when there were more than :data:`RARE_HASHES_MAX` or none were recorded.

    """

    values: pa.Array
    ids: np.ndarray
    cardinality: int
    hashed: bool
    rare_count: int | None = None
    rare_hashes: np.ndarray | None = None

    @classmethod
    def fit(
        cls,
        distinct: pa.Array,
        counts: np.ndarray,
        min_frequency: int = 1,
        max_vocab_size: int | None = None,
    ) -> Vocabulary:
        """Keep values seen at least ``min_frequency`` times; hash fields with too many values.

        Args:
            distinct: distinct raw values (length ``U``) from
                :func:`~ssl_rec.vocab.coded_column.count_values`.
            counts: ``int64[U]`` training frequency of each value (zeros are ignored).
            min_frequency: values seen fewer times map to id 0 (unhashed fields only).
            max_vocab_size: a field with more than ``max_vocab_size - 1`` distinct training
                values is hashed into ``max_vocab_size`` ids; ``None`` for no limit.

        """
        if isinstance(distinct, pa.ChunkedArray):
            distinct = distinct.combine_chunks()
        counts = np.asarray(counts, np.int64)
        seen = counts > 0
        if max_vocab_size is not None and int(seen.sum()) > max_vocab_size - 1:
            return cls.hashed_buckets(max_vocab_size)
        keep = counts >= max(min_frequency, 1)
        values, kept = distinct.filter(pa.array(keep)), counts[keep]
        values = values.take(pa.array(frequency_order(values, kept)))
        n = len(values)
        rare = seen & ~keep
        rare_count = int(rare.sum())
        hashes = None
        if rare_count <= RARE_HASHES_MAX:
            hashes = np.sort(hash_strings(distinct.filter(pa.array(rare))))
        ids = np.arange(1, n + 1, dtype=np.int32)
        return cls(values, ids, max(n + 1, 2), False, rare_count, hashes)

    def rare_in_training(self, values: pa.Array) -> np.ndarray | None:
        """``bool[U]``: which non-null ``values`` were rarer than ``min_frequency`` in training.

        ``None`` when the vocabulary does not know (not recorded, or too many rare values).
        """
        return None if self.rare_hashes is None else hashes_contain(self.rare_hashes, values)

    @classmethod
    def hashed_buckets(cls, cardinality: int) -> Vocabulary:
        """A vocabulary hashing every value into ``cardinality - 1`` buckets (ids ``1..``)."""
        if cardinality < 2:
            raise ValueError(f"a hashed vocabulary needs cardinality >= 2, got {cardinality}")
        return cls(pa.array([], pa.string()), np.zeros(0, np.int32), cardinality, True)

    def bucket_ids(self, values: pa.Array) -> np.ndarray:
        """``int32[U]`` bucket id of each non-null value of a hashed vocabulary."""
        buckets = hash_strings(values) % np.uint64(self.cardinality - 1)
        return buckets.astype(np.int32) + 1

    def encode(self, column: CodedColumn) -> np.ndarray:
        """Map raw values to ids: kept values to their id, anything else to 0.

        Only the column's distinct values are looked up; rows are a table lookup.

        Args:
            column: ``N`` rows as dictionary + codes (-1 = missing).

        Returns:
            ``int32[N]`` ids in ``0..cardinality-1``.

        """
        if self.hashed:
            per_value = np.concatenate([[MISSING_ID], self.bucket_ids(column.dictionary)])
            return per_value.astype(np.int32)[column.codes + 1]
        pos = pc.index_in(column.dictionary, value_set=self.values).fill_null(-1).to_numpy()
        kept = np.concatenate([[MISSING_ID], self.ids]).astype(np.int32)
        per_value = np.concatenate([[MISSING_ID], kept[pos + 1]]).astype(np.int32)
        return per_value[column.codes + 1]

    def id_values(self) -> pa.Array:
        """Raw value of every id (``cardinality`` strings; id 0 = ``"<missing>"``).

        Ids without a value are ``"<unused>"``; every bucket of a hashed field is
        ``"<hashed>"`` (dictionary-encoded, one byte per id).
        """
        if self.hashed:
            indices = np.ones(self.cardinality, np.int8)
            indices[MISSING_ID] = 0
            names = pa.array([MISSING_VALUE, HASHED_VALUE], pa.string())
            return pa.DictionaryArray.from_arrays(pa.array(indices), names)
        out = np.full(self.cardinality, -1, np.int64)
        out[self.ids] = np.arange(len(self.ids))
        taken = self.values.take(pa.array(out, mask=out < 0))
        values = pc.fill_null(taken.cast(pa.string()), UNUSED_VALUE)
        return pa.concat_arrays([pa.array([MISSING_VALUE], pa.string()), values[1:]])
