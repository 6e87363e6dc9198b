"""Exact streaming value counts of one categorical field, in memory bounded by its vocabulary.

Batches add ``(distinct values, counts)``; values of at most 8 bytes (Criteo's 8-hex-digit
hashes, short codes) are counted under their exact 64-bit key
(:func:`ssl_rec.vocab.strings.string_keys`) in a sorted array, longer ones as strings with
Arrow's hash aggregation. Pending batches are merged into the sorted state once they hold a
quarter as many entries as it (only they are sorted, the state is copied once with them
inserted), so the memory is about 16 bytes per distinct short value plus a transient copy
while merging. A field with more distinct values than ``max_vocab_size - 1`` stops
counting: it will be hashed, which needs no counts.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ssl_rec.vocab import Vocabulary, key_strings, string_keys

MERGE_MIN = 1 << 18
# Pending entries are merged once they reach this share of the state: bounds their memory.
PENDING_SHARE = 4


def _sum_duplicates(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(keys, kind="stable")
    keys, counts = keys[order], counts[order]
    if not len(keys):
        return keys, counts
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return keys[starts], np.add.reduceat(counts, starts)


def _merge_sorted(
    keys: np.ndarray, counts: np.ndarray, new_keys: np.ndarray, new_counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Add ``(new_keys, new_counts)`` to sorted distinct ``keys`` and their ``counts``.

    Only the new entries are sorted; the state is copied once (with the new keys inserted
    in place), so the transient memory is about twice the state, not a sort of all of it.
    """
    new_keys, new_counts = _sum_duplicates(new_keys, new_counts)
    pos = np.searchsorted(keys, new_keys)
    known = pos < len(keys)
    known[known] = keys[pos[known]] == new_keys[known]
    counts[pos[known]] += new_counts[known]  # distinct keys: distinct positions
    fresh = ~known
    return np.insert(keys, pos[fresh], new_keys[fresh]), np.insert(
        counts, pos[fresh], new_counts[fresh]
    )


class ValueCounter:
    """Counts the raw values of one field over a stream of batches.

    Args:
        max_vocab_size: stop counting once more than ``max_vocab_size - 1`` distinct values
            are seen (the field will be hashed); ``None`` counts every value.

    Example:
        >>> c = ValueCounter(None)
        >>> c.add(pa.array(["a", "b"]), np.array([2, 1]))
        >>> c.add(pa.array(["a"]), np.array([5]))
        >>> c.vocabulary(min_frequency=1).values.to_pylist()
        ['a', 'b']

    """

    def __init__(self, max_vocab_size: int | None) -> None:
        self.max_vocab_size = max_vocab_size
        self.overflow = False
        self._keys = np.zeros(0, np.uint64)
        self._counts = np.zeros(0, np.int64)
        self._long = pa.table(
            {"value": pa.array([], pa.large_string()), "count": pa.array([], pa.int64())}
        )
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_long: list[pa.Table] = []
        self._pending_rows = 0

    @property
    def distinct(self) -> int:
        """Distinct values merged so far (a lower bound until :meth:`flush`)."""
        return len(self._keys) + self._long.num_rows

    def add(self, values: pa.Array, counts: np.ndarray) -> None:
        """Add ``counts int64[U]`` occurrences of distinct non-null ``values`` (length ``U``).

        Values with a count of 0 are ignored.
        """
        if self.overflow or not len(values):
            return
        counts = np.asarray(counts, np.int64)
        keys, exact = string_keys(values)
        seen = counts > 0
        if not seen.all():
            exact, longer_seen = exact & seen, ~exact & seen
        else:
            longer_seen = ~exact
        self._pending.append((keys[exact], counts[exact]))
        if longer_seen.any():
            longer = pa.array(longer_seen)
            self._pending_long.append(pa.table({
                "value": values.filter(longer).cast(pa.large_string()),
                "count": pa.array(counts[longer_seen]),
            }))  # fmt: skip
        self._pending_rows += len(values)
        if self._pending_rows >= max(self.distinct // PENDING_SHARE, MERGE_MIN):
            self.flush()

    def flush(self) -> None:
        """Merge the pending batches into the state (then ``distinct`` is exact)."""
        if self._pending:
            keys = np.concatenate([k for k, _ in self._pending])
            counts = np.concatenate([c for _, c in self._pending])
            self._pending = []
            self._keys, self._counts = _merge_sorted(self._keys, self._counts, keys, counts)
        if self._pending_long:
            table = pa.concat_tables([self._long, *self._pending_long])
            summed = table.group_by("value").aggregate([("count", "sum")])
            self._long = summed.rename_columns(["value", "count"])
        self._pending, self._pending_long, self._pending_rows = [], [], 0
        if self.max_vocab_size is not None and self.distinct > self.max_vocab_size - 1:
            self.overflow = True
            self._keys, self._counts = np.zeros(0, np.uint64), np.zeros(0, np.int64)
            self._long = self._long.slice(0, 0)

    def result(self) -> tuple[pa.Array, np.ndarray]:
        """``(distinct values, int64 counts)`` of everything added (empty after overflow)."""
        self.flush()
        values = key_strings(self._keys)
        if not self._long.num_rows:
            return values, self._counts
        longer = self._long.column("value").combine_chunks()
        values = pa.concat_arrays([values.cast(pa.large_string()), longer])
        counts = np.concatenate([self._counts, self._long.column("count").to_numpy()])
        return values, counts

    def vocabulary(self, min_frequency: int) -> Vocabulary:
        """Fit the field's :class:`Vocabulary` (same result as ``Vocabulary.fit`` on all rows).

        The counts are released (the counter is then empty): fields are fitted one after
        another while the others still hold theirs, so peak memory stays that of counting.
        """
        values, counts = self.result()
        self._keys, self._counts = np.zeros(0, np.uint64), np.zeros(0, np.int64)
        self._long = self._long.slice(0, 0)
        if self.overflow:
            return Vocabulary.hashed_buckets(self.max_vocab_size)
        return Vocabulary.fit(values, counts, min_frequency, self.max_vocab_size)
