"""Exact streaming value counts of one categorical field, in memory bounded by its vocabulary.

Batches add ``(distinct values, counts)``; values of at most 8 bytes (Criteo's 8-hex-digit
hashes, short codes) are counted under their exact 64-bit key
(:func:`ssl_rec.vocabulary.string_keys`) in a sorted array, longer ones as strings with
Arrow's hash aggregation. Pending batches are merged once they hold as many entries as the
state, so the work per row stays constant and the memory is about 16 bytes per distinct
short value (plus a transient copy while merging). A field with more distinct values than
``max_vocab_size - 1`` stops counting: it will be hashed, which needs no counts.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ssl_rec.vocabulary import Vocabulary, key_strings, string_keys

MERGE_MIN = 1 << 18


def _sum_duplicates(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(keys, kind="stable")
    keys, counts = keys[order], counts[order]
    if not len(keys):
        return keys, counts
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return keys[starts], np.add.reduceat(counts, starts)


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
        if self._pending_rows >= max(self.distinct, MERGE_MIN):
            self.flush()

    def flush(self) -> None:
        """Merge the pending batches into the state (then ``distinct`` is exact)."""
        if self._pending:
            keys, counts = _sum_duplicates(
                np.concatenate([self._keys, *(k for k, _ in self._pending)]),
                np.concatenate([self._counts, *(c for _, c in self._pending)]),
            )
            self._keys, self._counts = keys, counts
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
