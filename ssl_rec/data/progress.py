"""Progress bar of one preprocessing pass: rows done, rows/s and the time left.

The rows of a file are unknown until it is read, so the total is estimated from the bytes
read so far (compressed bytes for gzip) and refined after every batch.
"""

from __future__ import annotations

from tqdm.auto import tqdm


class PassProgress:
    """``desc: 45%|####   | 1.20M/2.65M [00:04<00:05, 290k rows/s]``.

    Args:
        desc: name of the pass (``"count"``, ``"encode"``).
        total_bytes: bytes of all files the pass reads.

    Example:
        >>> bar = PassProgress("count", total_bytes=10_000)  # doctest: +SKIP
        >>> bar.update(rows=100, done_bytes=2_500)  # total becomes an estimated 400 rows

    """

    def __init__(self, desc: str, total_bytes: int) -> None:
        self.total_bytes = max(int(total_bytes), 1)
        self.rows = 0
        self._bar = tqdm(desc=desc, unit=" rows", unit_scale=True, total=None, smoothing=0.1)

    def update(self, rows: int, done_bytes: int) -> None:
        """Add ``rows`` read; ``done_bytes`` is how far the pass is through its files."""
        self.rows += rows
        if done_bytes > 0:
            estimate = round(self.rows * self.total_bytes / min(done_bytes, self.total_bytes))
            self._bar.total = max(estimate, self.rows)
        self._bar.update(rows)

    def close(self) -> None:
        """Finish the bar at the exact row count."""
        self._bar.total = self.rows
        self._bar.refresh()
        self._bar.close()
