"""Progress of one preprocessing pass: rows done, rows/s and the time left.

On a terminal it is a tqdm bar; in a log (output redirected to a file or a pipe) a bar
redrawn with carriage returns turns into kilobytes of noise, so there it is a few plain
lines instead (:class:`ProgressLines`). The rows of a file are unknown until it is read,
so the total is estimated from the bytes read so far (compressed bytes for gzip) and
refined after every batch.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from tqdm.auto import tqdm


def output_is_terminal(stream: IO[str] | None = None) -> bool:
    """Whether ``stream`` (default ``sys.stderr``, where tqdm draws) is an interactive terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def si_number(value: float) -> str:
    """``950``, ``23.5k``, ``1.20M``: three significant figures with an SI suffix."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            scaled = value / factor
            return f"{scaled:.3g}{suffix}" if scaled < 100 else f"{scaled:.0f}{suffix}"
    return f"{value:.3g}" if value != int(value) else str(int(value))


def duration(seconds: float) -> str:
    """``0.4 s``, ``12 s``, ``3 min 05 s``, ``1 h 02 min``."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


class ProgressLines:
    """A progress bar for logs: one plain line per tenth of the work, and a closing line.

    A line is printed when another tenth of ``total`` is done and ``min_interval`` seconds
    have passed since the last one, or after ``max_interval`` seconds whatever the share
    (an unknown total): ``encode: 1.20M/2.65M rows (45%), 290k rows/s, 5.0 s left``.

    Args:
        desc: what is measured (``"count"``, ``"encode"``).
        total: expected units (may be refined with :attr:`total`), ``None`` if unknown.
        unit: unit name in the lines.
        stream: where lines go (default ``sys.stderr``).
        min_interval: fewest seconds between two lines.
        max_interval: most seconds without a line.
        clock: seconds, monotonic (tests pass a fake).

    Example:
        >>> ticks = iter([0.0, 3.0, 6.0])  # a fake clock: 3 s per call
        >>> lines = ProgressLines("count", 1000, stream=sys.stdout, clock=lambda: next(ticks))
        >>> lines.update(500)
        count: 500/1k rows (50%), 167 rows/s, 3.0 s left
        >>> lines.close()
        count: 500 rows in 6.0 s (83.3 rows/s)

    """

    def __init__(
        self,
        desc: str,
        total: float | None = None,
        unit: str = "rows",
        stream: IO[str] | None = None,
        min_interval: float = 2.0,
        max_interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.desc, self.total, self.unit = desc, total, unit
        self.stream, self.clock = stream, clock
        self.min_interval, self.max_interval = min_interval, max_interval
        self.n = 0.0
        self.start = self._last = clock()
        self._tenths = 0

    def _write(self, text: str) -> None:
        print(text, file=self.stream if self.stream is not None else sys.stderr, flush=True)

    def update(self, n: float = 1) -> None:
        """Add ``n`` units done; print a line when due."""
        self.n += n
        now = self.clock()
        since = now - self._last
        known = self.total is not None and math.isfinite(self.total) and self.total > 0
        tenths = int(10 * min(self.n / self.total, 1.0)) if known else self._tenths
        if (tenths > self._tenths and since >= self.min_interval) or since >= self.max_interval:
            self._tenths = tenths
            self._last = now
            self._write(self.line(now))

    def line(self, now: float) -> str:
        """The progress line at time ``now``."""
        elapsed = max(now - self.start, 1e-9)
        rate = self.n / elapsed
        done = si_number(self.n)
        known = self.total is not None and math.isfinite(self.total) and self.total > 0
        if not known:
            return f"{self.desc}: {done} {self.unit}, {si_number(rate)} {self.unit}/s"
        share = min(self.n / self.total, 1.0)
        left = max(self.total - self.n, 0) / rate if rate > 0 else math.inf
        tail = f", {duration(left)} left" if math.isfinite(left) else ""
        return (f"{self.desc}: {done}/{si_number(self.total)} {self.unit} ({share:.0%}), "
                f"{si_number(rate)} {self.unit}/s{tail}")  # fmt: skip

    def close(self) -> None:
        """Print the closing line: units done, time taken, rate."""
        elapsed = max(self.clock() - self.start, 1e-9)
        self._write(f"{self.desc}: {si_number(self.n)} {self.unit} in {duration(elapsed)} "
                    f"({si_number(self.n / elapsed)} {self.unit}/s)")  # fmt: skip


def progress_bar(desc: str, total: float | None = None, unit: str = "rows") -> Any:
    """A tqdm bar on a terminal, else :class:`ProgressLines`; both have ``update`` / ``close``."""
    if output_is_terminal():
        return tqdm(desc=desc, total=total, unit=f" {unit}", unit_scale=True, smoothing=0.1)
    return ProgressLines(desc, total, unit)


class PassProgress:
    """``desc: 45%|####   | 1.20M/2.65M [00:04<00:05, 290k rows/s]`` (plain lines in a log).

    Args:
        desc: name of the pass (``"count"``, ``"encode"``).
        total_bytes: bytes of all files the pass reads.

    Example:
        >>> bar = PassProgress("count", total_bytes=10_000)
        >>> bar.update(rows=100, done_bytes=2_500)  # total becomes an estimated 400 rows
        >>> bar.close()  # the total becomes the 100 rows read

    """

    def __init__(self, desc: str, total_bytes: int) -> None:
        self.total_bytes = max(int(total_bytes), 1)
        self.rows = 0
        self._bar = progress_bar(desc)

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
        if isinstance(self._bar, tqdm):
            self._bar.refresh()
        self._bar.close()
