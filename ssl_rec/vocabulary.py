"""Per-field vocabularies: raw categorical values -> contiguous ids, and back.

Id 0 (:data:`MISSING_ID`) is reserved for missing, rare (below ``min_frequency``) and
unseen values; kept values get ids ``1..n`` in order of decreasing training frequency (ties
by value). A field with more distinct training values than ``max_vocab_size - 1`` is hashed
instead, as MLPerf's DLRM caps Criteo Terabyte tables: every value goes to bucket
``1 + hash(value) % (max_vocab_size - 1)``, so counting such a field needs no memory per
value. The raw value of each id is stored in ``<vocab_dir>/<field>.arrow`` (``"<hashed>"``
for the buckets of a hashed field) so ids can be mapped back to what they mean.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather

from ssl_rec.schema import MISSING_ID, FeatureSchema

MISSING_VALUE = "<missing>"
UNUSED_VALUE = "<unused>"
HASHED_VALUE = "<hashed>"
VOCAB_DIRNAME = "vocab"
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_SHORT_TAG = 0xF8


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


def _offsets_and_data(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(int64[U + 1] byte offsets, uint8 data)`` of a string array (no copy of the data)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    wide = pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type)
    width = 8 if wide else 4
    buffers = values.buffers()
    offsets = np.frombuffer(buffers[1], np.int64 if wide else np.int32, len(values) + 1,
                            values.offset * width).astype(np.int64)  # fmt: skip
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return offsets, data


def _padded_bytes(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(uint8[U, 8] first 8 bytes zero-padded, int64[U] byte length)`` of each string."""
    offsets, data = _offsets_and_data(values)
    lengths = np.diff(offsets)
    span = data[offsets[0] : offsets[-1]]
    if len(lengths) and (lengths == 8).all():
        return span.reshape(-1, 8), lengths
    cols = np.arange(8)
    mask = cols < np.minimum(lengths, 8)[:, None]
    out = np.zeros((len(lengths), 8), np.uint8)
    out[mask] = data[(offsets[:-1, None] + cols)[mask]]
    return out, lengths


def string_keys(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Exact 64-bit keys of strings of at most 8 bytes (Criteo's 8-hex-digit values).

    An 8-byte string is its bytes read little-endian; a shorter one is its bytes plus
    ``(0xF8 + length) << 56``. UTF-8 never contains a byte >= 0xF8, so the two kinds never
    collide and the key is injective: equal keys mean equal strings.

    Args:
        values: non-null strings, length ``U``.

    Returns:
        ``(keys uint64[U], exact bool[U])``; ``exact`` is false for longer strings (their key
        is meaningless).

    """
    padded, lengths = _padded_bytes(values)
    keys = np.ascontiguousarray(padded).view("<u8").ravel().copy()
    short = lengths < 8
    keys[short] |= (lengths[short].astype(np.uint64) + np.uint64(_SHORT_TAG)) << np.uint64(56)
    exact = short | ((lengths == 8) & (padded[:, 7] < _SHORT_TAG))
    return keys, exact


def key_strings(keys: np.ndarray) -> pa.Array:
    """The strings of exact keys from :func:`string_keys` (its inverse)."""
    keys = np.ascontiguousarray(keys, np.uint64)
    top = (keys >> np.uint64(56)).astype(np.int64)
    lengths = np.where(top >= _SHORT_TAG, top - _SHORT_TAG, 8)
    padded = keys.view(np.uint8).reshape(-1, 8)
    data = padded[np.arange(8) < lengths[:, None]]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    kind = pa.string() if offsets[-1] < 2**31 else pa.large_string()
    offsets = offsets.astype(np.int32 if kind == pa.string() else np.int64)
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(data))]
    return pa.Array.from_buffers(kind, len(keys), buffers)


def hash_strings(values: pa.Array) -> np.ndarray:
    """Deterministic 64-bit hash of each string, identical across runs and platforms.

    ``splitmix64`` of the :func:`string_keys` key for strings of at most 8 bytes; a
    polynomial over the bytes with the same finish for longer ones.

    Args:
        values: non-null string array of length ``U``.

    Returns:
        ``uint64[U]``.

    """
    keys, exact = string_keys(values)
    out = _splitmix64(keys)
    if not exact.all():
        out[~exact] = _polynomial_hash(values.filter(pa.array(~exact)))
    return out


def _polynomial_hash(values: pa.Array) -> np.ndarray:
    offsets, data = _offsets_and_data(values)
    starts, lengths = offsets[:-1], np.diff(offsets)
    out = lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    if data.size and lengths.max() > 0:
        seg = data[offsets[0] : offsets[-1]].astype(np.uint64)
        pos = np.arange(seg.size, dtype=np.int64) - np.repeat(starts - offsets[0], lengths)
        powers = np.cumprod(np.full(int(lengths.max()), 1099511628211, np.uint64), dtype=np.uint64)
        terms = seg * powers[pos]
        nonempty = lengths > 0
        sums = np.add.reduceat(terms, (starts - offsets[0])[nonempty]) if terms.size else terms
        out[nonempty] ^= sums
    return _splitmix64(out)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
        return x ^ (x >> np.uint64(31))


def frequency_order(values: pa.Array, counts: np.ndarray) -> np.ndarray:
    """Positions of ``values`` by decreasing count, ties by value (bytewise).

    Ids then never depend on how the data was chunked or in which order values were seen.
    """
    if not len(values):
        return np.zeros(0, np.int64)
    keys, exact = string_keys(values)
    if exact.all():
        padded, lengths = _padded_bytes(values)
        big_endian = np.ascontiguousarray(padded).view(">u8").ravel()
        return np.lexsort((lengths, big_endian, -counts))
    table = pa.table({"count": pa.array(counts), "value": values})
    order = pc.sort_indices(table, sort_keys=[("count", "descending"), ("value", "ascending")])
    return order.to_numpy()


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

    """

    values: pa.Array
    ids: np.ndarray
    cardinality: int
    hashed: bool

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
            distinct: distinct raw values (length ``U``) from :func:`count_values`.
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
        return cls(values, np.arange(1, n + 1, dtype=np.int32), max(n + 1, 2), False)

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

    def save(self, vocab_dir: str | os.PathLike[str], field: str) -> Path:
        """Write the raw value of each id to ``<vocab_dir>/<field>.arrow``."""
        return save_id_values(vocab_dir, field, self.id_values())


def save_id_values(vocab_dir: str | os.PathLike[str], field: str, values: pa.Array) -> Path:
    """Write precomputed raw values (one per id, id 0 first) to ``<vocab_dir>/<field>.arrow``."""
    path = Path(vocab_dir) / f"{field}.arrow"
    path.parent.mkdir(parents=True, exist_ok=True)
    feather.write_feather(pa.table({"value": values}), str(path), compression="uncompressed")
    return path


def load_vocabulary(schema: FeatureSchema, field: str) -> np.ndarray:
    """Raw value of each id of ``field``, read from ``schema.metadata["vocab_dir"]``.

    Args:
        schema: a schema written by this package's preprocessing or generator.
        field: categorical field name.

    Returns:
        object array of ``cardinality`` strings; index = id, index 0 = ``"<missing>"``.

    Example:
        >>> load_vocabulary(schema, "C1")[3]  # doctest: +SKIP
        '05db9164'

    """
    cardinality = schema.field(field).cardinality
    vocab_dir = schema.metadata.get("vocab_dir")
    if not vocab_dir:
        raise ValueError("schema.metadata has no 'vocab_dir'; it was not made by ssl_rec")
    path = Path(vocab_dir) / f"{field}.arrow"
    if not path.is_file():
        raise FileNotFoundError(f"no vocabulary for field {field!r} at {path}")
    values = feather.read_table(str(path), memory_map=True).column("value")
    out = values.to_numpy(zero_copy_only=False)
    if len(out) != cardinality:
        raise ValueError(
            f"{path}: {len(out)} values but field {field!r} has cardinality {cardinality}"
        )
    return out
