"""Per-field vocabularies: raw categorical values -> contiguous ids, and back.

Id 0 (:data:`MISSING_ID`) is reserved for missing, rare (below ``min_frequency``) and
unseen values; kept values get ids ``1..n`` in order of decreasing training frequency.
A field whose vocabulary exceeds ``max_vocab_size`` is hashed instead: every kept value
goes to bucket ``1 + hash(value) % (max_vocab_size - 1)``. The raw value of each id is
stored in ``<vocab_dir>/<field>.arrow`` (for a hashed field, the most frequent value of
the bucket) so ids can be mapped back to what they mean.
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
VOCAB_DIRNAME = "vocab"
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


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


def hash_strings(values: pa.Array) -> np.ndarray:
    """Deterministic 64-bit hash of each string (polynomial over bytes, splitmix64 finish).

    Args:
        values: non-null string array of length ``U``.

    Returns:
        ``uint64[U]``, identical across runs and platforms.

    """
    values = pc.cast(values, pa.large_string())
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    buffers = values.buffers()
    offsets = np.frombuffer(buffers[1], np.int64)[values.offset :][: len(values) + 1]
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    starts, ends = offsets[:-1], offsets[1:]
    lengths = ends - starts
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


@dataclass(frozen=True)
class Vocabulary:
    """The kept raw values of one field and the id of each.

    Args:
        values: kept raw values (strings), most frequent first, length ``U``.
        ids: ``int32[U]`` id of each kept value (``1..U`` or hash buckets).
        cardinality: number of ids including the reserved id 0.
        hashed: whether values were hashed into ``cardinality - 1`` buckets.

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
        """Keep values seen at least ``min_frequency`` times; hash if too many remain.

        Args:
            distinct: distinct raw values (length ``U``) from :func:`count_values`.
            counts: ``int64[U]`` training frequency of each value.
            min_frequency: values seen fewer times map to id 0.
            max_vocab_size: largest cardinality (including id 0), or ``None`` for no limit.

        """
        # Ties broken by value so the ids do not depend on file chunking.
        order = np.lexsort((np.arange(len(counts)), -counts))
        sorted_values = distinct.take(pa.array(order))
        keep = counts[order] >= max(min_frequency, 1)
        values = sorted_values.filter(pa.array(keep))
        n = len(values)
        if max_vocab_size is None or n + 1 <= max_vocab_size:
            return cls(values, np.arange(1, n + 1, dtype=np.int32), n + 1, False)
        buckets = max_vocab_size - 1
        ids = (hash_strings(values) % np.uint64(buckets)).astype(np.int32) + 1
        return cls(values, ids, max_vocab_size, True)

    def encode(self, column: CodedColumn) -> np.ndarray:
        """Map raw values to ids: kept values to their id, anything else to 0.

        Only the column's distinct values are hashed; rows are a table lookup.

        Args:
            column: ``N`` rows as dictionary + codes (-1 = missing).

        Returns:
            ``int32[N]`` ids in ``0..cardinality-1``.

        """
        pos = pc.index_in(column.dictionary, value_set=self.values).fill_null(-1).to_numpy()
        kept = np.concatenate([[MISSING_ID], self.ids]).astype(np.int32)
        per_value = np.concatenate([[MISSING_ID], kept[pos + 1]]).astype(np.int32)
        return per_value[column.codes + 1]

    def id_values(self) -> pa.Array:
        """Raw value of every id (``cardinality`` strings; id 0 = ``"<missing>"``)."""
        out = np.full(self.cardinality, -1, np.int64)
        # Reverse order so the most frequent value of a hash bucket is written last, wins.
        ids = self.ids[::-1]
        out[ids] = np.arange(len(self.ids))[::-1]
        taken = self.values.take(pa.array(out, mask=out < 0))
        return pc.fill_null(taken.cast(pa.string()), UNUSED_VALUE)

    def save(self, vocab_dir: str | os.PathLike[str], field: str) -> Path:
        """Write the raw value of each id to ``<vocab_dir>/<field>.arrow``."""
        values = self.id_values()
        values = pa.concat_arrays([pa.array([MISSING_VALUE], pa.string()), values[1:]])
        path = Path(vocab_dir) / f"{field}.arrow"
        path.parent.mkdir(parents=True, exist_ok=True)
        feather.write_feather(pa.table({"value": values}), str(path), compression="uncompressed")
        return path


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
