"""Raw value -> id for a stream of batches, built once per fitted :class:`Vocabulary`.

``Vocabulary.encode`` builds a hash set of the whole vocabulary on every call; a stream of
batches needs a structure built once: an open-addressing hash table of the exact keys of
short values (:func:`ssl_rec.vocab.strings.string_keys`; 16 bytes per slot at load <= 0.6,
about 27 bytes per value), and a dict for the rare values longer than 8 bytes. Only a
batch's distinct values are looked up; rows then take their id by position. Values that get
id 0 are told apart, where the vocabulary recorded its rare values, into those rarer than
``min_frequency`` in training and those never seen there (:meth:`VocabularyLookup.classify`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ssl_rec.schema import MISSING_ID
from ssl_rec.vocab import Vocabulary, hashes_contain, string_keys


def dictionary_of(column: pa.Array | pa.ChunkedArray) -> pa.DictionaryArray:
    """A string column as one dictionary array (distinct values + ``int32`` indices)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        return column
    return pc.dictionary_encode(column)


def codes_of(column: pa.DictionaryArray) -> np.ndarray:
    """``int32[N]`` dictionary position of each row, -1 where null (no copy without nulls)."""
    indices = column.indices
    if indices.type != pa.int32():
        indices = indices.cast(pa.int32())
    n, offset = len(indices), indices.offset
    values = np.frombuffer(indices.buffers()[1], np.int32, n, offset * 4)
    if not indices.null_count:
        return values
    bits = np.frombuffer(indices.buffers()[0], np.uint8)
    valid = np.unpackbits(bits, bitorder="little")[offset : offset + n].astype(bool)
    return np.where(valid, values, -1).astype(np.int32)


def dictionary_counts(column: pa.DictionaryArray, rows: np.ndarray | None = None) -> np.ndarray:
    """``int64[U]`` occurrences of each dictionary value (in ``rows bool[N]`` if given)."""
    codes = codes_of(column)
    if rows is not None:
        codes = codes[rows]
    return np.bincount(codes + 1, minlength=len(column.dictionary) + 1)[1:].astype(np.int64)


def _mix(keys: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        keys = keys * np.uint64(0x9E3779B97F4A7C15)
    return keys ^ (keys >> np.uint64(29))


class KeyTable:
    """Open-addressing (linear probing) hash table ``uint64 key -> id``, vectorised.

    Args:
        keys: distinct ``uint64[n]`` keys.
        ids: ``int32[n]`` their ids, all ``>= 1`` (0 marks an empty slot).

    """

    LOAD = 0.6
    # Keys are inserted this many at a time: the probing state stays a few MB per table.
    CHUNK = 1 << 18

    def __init__(self, keys: np.ndarray, ids: np.ndarray) -> None:
        self.size = max(int(len(keys) / self.LOAD) + 1, 8)
        # Key and id side by side: a probe touches one cache line, not two.
        self.slots = np.zeros((self.size, 2), np.uint64)
        for start in range(0, len(keys), self.CHUNK):
            end = start + self.CHUNK
            self._insert(keys[start:end], ids[start:end])

    def _insert(self, keys: np.ndarray, ids: np.ndarray) -> None:
        pos = self._slot(keys)
        pending = np.arange(len(keys))
        while pending.size:
            slot = pos[pending]
            free = np.flatnonzero(self.slots[slot, 1] == 0)
            self.slots[slot[free], 0] = keys[pending[free]]
            self.slots[slot[free], 1] = ids[pending[free]]
            # Several keys may claim one free slot; the last write wins, the others probe on.
            placed = np.zeros(len(pending), bool)
            placed[free] = self.slots[slot[free], 0] == keys[pending[free]]
            pending = pending[~placed]
            pos[pending] = (pos[pending] + 1) % self.size

    def _slot(self, keys: np.ndarray) -> np.ndarray:
        # Lemire's multiply-shift maps the top 32 hash bits onto [0, size).
        high = _mix(keys) >> np.uint64(32)
        with np.errstate(over="ignore"):
            return ((high * np.uint64(self.size)) >> np.uint64(32)).astype(np.int64)

    def get(self, queries: np.ndarray) -> np.ndarray:
        """``int32[m]`` id of each ``uint64[m]`` query, 0 where absent."""
        out = np.zeros(len(queries), np.int32)
        pos = self._slot(queries)
        pending = np.arange(len(queries))
        while pending.size:
            found = np.take(self.slots, pos[pending], axis=0)
            occupied = found[:, 1] != 0
            hit = occupied & (found[:, 0] == queries[pending])
            out[pending[hit]] = found[hit, 1]
            pending = pending[occupied & ~hit]
            pos[pending] = (pos[pending] + 1) % self.size
        return out


class VocabularyLookup:
    """Encodes batches with one field's fitted vocabulary.

    Args:
        vocabulary: the field's vocabulary (exact or hashed). An exact one's values are not
            kept: the lookup holds only its key table, so the caller may release them.

    Example:
        >>> lookup = VocabularyLookup(Vocabulary.fit(pa.array(["a", "b"]), np.array([3, 1])))
        >>> lookup.encode(pa.array(["b", None, "zz"]))
        (array([2, 0, 0], dtype=int32), 1)

    """

    def __init__(self, vocabulary: Vocabulary) -> None:
        self._hashed = vocabulary if vocabulary.hashed else None
        self._rare_hashes = vocabulary.rare_hashes  # at most RARE_HASHES_MAX
        self._table: KeyTable | None = None
        self._long: dict[str, int] = {}
        if vocabulary.hashed or not len(vocabulary.values):
            return
        keys, exact = string_keys(vocabulary.values)
        if exact.any():
            self._table = KeyTable(keys[exact], np.asarray(vocabulary.ids, np.int32)[exact])
        if not exact.all():
            longer = vocabulary.values.filter(pa.array(~exact)).to_pylist()
            self._long = dict(zip(longer, vocabulary.ids[~exact].tolist(), strict=True))

    def ids_of(self, values: pa.Array) -> np.ndarray:
        """``int32[U]`` id of each distinct non-null value (0 = rare or unseen)."""
        if self._hashed is not None:
            return self._hashed.bucket_ids(values)
        out = np.zeros(len(values), np.int32)
        if not len(values) or not (self._table is not None or self._long):
            return out
        keys, exact = string_keys(values)
        if self._table is not None:
            out[exact] = self._table.get(keys[exact])
        if self._long and not exact.all():
            longer = values.filter(pa.array(~exact)).to_pylist()
            out[~exact] = [self._long.get(v, MISSING_ID) for v in longer]
        return out

    def encode_rows(self, column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
        """``(ids int32[N], unseen bool[N])`` of a string (or dictionary) column.

        ``unseen`` marks non-missing values mapped to id 0 (rare in training or never seen).
        """
        encoded = dictionary_of(column)
        per_value = np.concatenate([[MISSING_ID], self.ids_of(encoded.dictionary)])
        codes = codes_of(encoded)
        ids = per_value.astype(np.int32)[codes + 1]
        return ids, (ids == MISSING_ID) & (codes >= 0)

    def encode(self, column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, int]:
        """Ids of a string column (or dictionary column).

        Args:
            column: ``N`` raw values, null = missing.

        Returns:
            ``(ids int32[N], unseen)``: ``unseen`` counts non-missing values mapped to id 0
            (rare in training or never seen).

        """
        ids, unseen = self.encode_rows(column)
        return ids, int(np.count_nonzero(unseen))

    @property
    def knows_rare(self) -> bool:
        """Whether :meth:`classify` can tell rare training values from never-seen ones."""
        return self._rare_hashes is not None

    def classify(
        self, column: pa.Array | pa.ChunkedArray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ids int32[N], unseen bool[N], rare bool[N])`` of a string (or dictionary) column.

        ``unseen`` marks non-missing values mapped to id 0; ``rare`` the subset of them that
        were rarer than ``min_frequency`` in training (all false unless :attr:`knows_rare`).
        """
        encoded = dictionary_of(column)
        per_value = self.ids_of(encoded.dictionary)
        rare_value = np.zeros(len(per_value), bool)
        zero = np.flatnonzero(per_value == MISSING_ID)
        if zero.size and self.knows_rare:
            zero_values = encoded.dictionary.take(pa.array(zero))
            rare_value[zero] = hashes_contain(self._rare_hashes, zero_values)
        codes = codes_of(encoded)
        ids = np.concatenate([[MISSING_ID], per_value]).astype(np.int32)[codes + 1]
        unseen = (ids == MISSING_ID) & (codes >= 0)
        rare = np.concatenate([[False], rare_value])[codes + 1] & unseen
        return ids, unseen, rare
