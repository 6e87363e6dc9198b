"""String arrays as bytes: their buffers, exact 64-bit keys of short values, stable hashes.

Criteo's values are 8-hex-digit strings, so most values of most fields fit in 8 bytes: their
bytes are their key (:func:`string_keys`), which sorts, counts and looks up without a Python
object per value; longer values fall back to Arrow's own kernels.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_SHORT_TAG = 0xF8
_BUFFER_TYPES = (pa.string(), pa.large_string(), pa.binary(), pa.large_binary())


def string_buffers(values: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 bytes and byte offsets of a non-null string array, without copying the bytes.

    Args:
        values: ``U`` non-null strings (``string`` or ``large_string``; other types are cast
            to ``large_string`` first).

    Returns:
        ``(data uint8[bytes], offsets int64[U + 1])``: string ``i`` is
        ``data[offsets[i]:offsets[i + 1]]``; ``offsets[0]`` is 0.

    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if values.type not in _BUFFER_TYPES:
        values = pc.cast(values, pa.large_string())
    if not len(values):
        return np.zeros(0, np.uint8), np.zeros(1, np.int64)
    wide = values.type in (pa.large_string(), pa.large_binary())
    _, offsets_buf, data_buf = values.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64 if wide else np.int32, len(values) + 1,
                            values.offset * (8 if wide else 4)).astype(np.int64)  # fmt: skip
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    start = int(offsets[0])
    return data[start : int(offsets[-1])], offsets - start


def strings_from_buffers(data: np.ndarray, offsets: np.ndarray) -> pa.Array:
    """Inverse of :func:`string_buffers` (zero-copy; ``offsets`` int32 or int64)."""
    n = len(offsets) - 1
    kind = pa.large_string() if offsets.dtype == np.int64 else pa.string()
    buffers = [None, pa.py_buffer(np.ascontiguousarray(offsets)), pa.py_buffer(data)]
    return pa.Array.from_buffers(kind, n, buffers)


def _padded_bytes(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(uint8[U, 8] first 8 bytes zero-padded, int64[U] byte length)`` of each string."""
    data, offsets = string_buffers(values)
    lengths = np.diff(offsets)
    if len(lengths) and (lengths == 8).all():
        return data.reshape(-1, 8), lengths
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
    small = offsets[-1] < 2**31
    return strings_from_buffers(np.ascontiguousarray(data),
                                offsets.astype(np.int32 if small else np.int64))  # fmt: skip


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


def hashes_contain(sorted_hashes: np.ndarray, values: pa.Array) -> np.ndarray:
    """``bool[U]``: whether each non-null string's :func:`hash_strings` is in ``sorted_hashes``."""
    if not len(values) or not len(sorted_hashes):
        return np.zeros(len(values), bool)
    hashes = hash_strings(values)
    pos = np.minimum(np.searchsorted(sorted_hashes, hashes), len(sorted_hashes) - 1)
    return sorted_hashes[pos] == hashes


def _polynomial_hash(values: pa.Array) -> np.ndarray:
    data, offsets = string_buffers(values)
    starts, lengths = offsets[:-1], np.diff(offsets)
    out = lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    if data.size and lengths.max() > 0:
        seg = data.astype(np.uint64)
        pos = np.arange(seg.size, dtype=np.int64) - np.repeat(starts, lengths)
        powers = np.cumprod(np.full(int(lengths.max()), 1099511628211, np.uint64), dtype=np.uint64)
        terms = seg * powers[pos]
        nonempty = lengths > 0
        sums = np.add.reduceat(terms, starts[nonempty]) if terms.size else terms
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
