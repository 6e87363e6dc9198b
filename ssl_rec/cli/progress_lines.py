"""Training progress as plain lines when the output is a log, not a terminal.

Lightning's tqdm bar redraws itself with carriage returns many times a second; sent to a
file (``make demo > log``, a batch job) that is hundreds of kilobytes. When standard output
is not a terminal, ``ssl-rec`` replaces it with :class:`ProgressLinesBar`: a line per tenth
of a training epoch (step, rate, loss), one at the end of each epoch with the validation
metrics, and one per test / predict run.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import IO, Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks.progress.progress_bar import ProgressBar

from ssl_rec.data.progress import duration, output_is_terminal

# Progress-bar metrics left out of the lines: the W&B version is noise in a log.
_HIDDEN = ("v_num",)


def _metrics_text(metrics: dict[str, Any], validation: bool = True) -> str:
    parts = []
    for name, value in metrics.items():
        if name in _HIDDEN or (not validation and name.startswith("val")):
            continue
        if isinstance(value, float | int) and not isinstance(value, bool):
            parts.append(f"{name}={value:.4g}")
        else:
            parts.append(f"{name}={value}")
    return " ".join(parts)


class ProgressLinesBar(ProgressBar):
    """Lightning progress as plain lines: for logs, where a redrawn bar is noise.

    Args:
        min_interval: fewest seconds between two lines inside an epoch.
        max_interval: most seconds without a line while training or evaluating.
        stream: where lines go (default ``sys.stdout``, as Lightning's bar).
        clock: seconds, monotonic (tests pass a fake).

    """

    def __init__(
        self,
        min_interval: float = 5.0,
        max_interval: float = 60.0,
        stream: IO[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.min_interval, self.max_interval = min_interval, max_interval
        self.stream, self.clock = stream, clock
        self._enabled = True
        self._start = self._last = 0.0
        self._tenths = self._done = 0

    @property
    def is_enabled(self) -> bool:
        """Whether lines are printed (off on ranks other than 0)."""
        return self._enabled

    def disable(self) -> None:
        """Print nothing."""
        self._enabled = False

    def enable(self) -> None:
        """Print lines again."""
        self._enabled = True

    def _write(self, text: str) -> None:
        if self._enabled:
            print(text, file=self.stream if self.stream is not None else sys.stdout, flush=True)

    def _begin(self) -> None:
        self._start = self._last = self.clock()
        self._tenths = self._done = 0

    def _due(self, done: int, total: float, max_only: bool = False) -> bool:
        """Whether a line is due after ``done`` of ``total`` batches."""
        now = self.clock()
        since = now - self._last
        known = math.isfinite(total) and total > 0
        tenths = int(10 * done / total) if known else self._tenths
        if since >= self.max_interval or (
            not max_only and tenths > self._tenths and since >= self.min_interval
        ):
            self._tenths, self._last = tenths, now
            return True
        return False

    def _count(self, verb: str) -> None:
        """Count a batch of a test or predict run (no known total): a line when one is due."""
        self._done += 1
        if self._due(self._done, math.inf, max_only=True):
            self._write(f"{verb}: batch {self._done}")

    def _total(self, verb: str) -> None:
        """The last line of a test or predict run: batches done and time."""
        elapsed = duration(self.clock() - self._start)
        self._write(f"{verb}: {self._done} batches in {elapsed}")

    def _rate(self, done: int) -> str:
        elapsed = max(self.clock() - self._start, 1e-9)
        return f"{done / elapsed:.3g} it/s"

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start timing: an epoch resumed from a mid-epoch checkpoint has no epoch start."""
        self._begin()

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start timing the epoch."""
        self._begin()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        """A line per tenth of the epoch (at most one per ``min_interval`` seconds)."""
        self._done += 1
        done, total = batch_idx + 1, self.total_train_batches
        if done < total and self._due(done, total):
            of = f"/{total}" if math.isfinite(total) else ""
            share = f" ({done / total:.0%})" if math.isfinite(total) and total else ""
            # The last validation's metrics wait for the epoch's line.
            metrics = _metrics_text(self.get_metrics(trainer, pl_module), validation=False)
            self._write(f"epoch {trainer.current_epoch}: step {done}{of}{share}, "
                        f"{self._rate(done)}, {metrics}".rstrip(", "))  # fmt: skip

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The epoch's line: batches, time, rate, loss and validation metrics."""
        done = self._done
        elapsed = duration(self.clock() - self._start)
        metrics = _metrics_text(self.get_metrics(trainer, pl_module))
        self._write(f"epoch {trainer.current_epoch}: {done} steps in {elapsed} "
                    f"({self._rate(done)}), {metrics}".rstrip(", "))  # fmt: skip

    def on_validation_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int, dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        """During a long validation, a line every ``max_interval`` seconds."""
        if trainer.sanity_checking:
            return
        totals = trainer.num_val_batches
        total = totals[dataloader_idx] if dataloader_idx < len(totals) else math.inf
        if self._due(batch_idx + 1, total, max_only=True):
            self._write(f"validating: batch {batch_idx + 1}/{total}")

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start timing the test run."""
        self._begin()

    def on_test_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int, dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        """Count the batch; during a long test, a line every ``max_interval`` seconds."""
        self._count("testing")

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """One line: batches tested and time."""
        self._total("testing")

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start timing the predict run."""
        self._begin()

    def on_predict_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int, dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        """Count the batch; during a long run, a line every ``max_interval`` seconds."""
        self._count("predicting")

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """One line: batches predicted and time."""
        self._total("predicting")


def plain_progress_callbacks(config: dict[str, Any], given: list[Any]) -> list[Any]:
    """``[ProgressLinesBar()]`` when the trainer would draw its tqdm bar into a log, else ``[]``.

    Args:
        config: the trainer's arguments (``enable_progress_bar``, ``callbacks``).
        given: the callbacks LightningCLI adds besides the config's.

    """
    if config.get("enable_progress_bar") is False or output_is_terminal(sys.stdout):
        return []
    configured = config.get("callbacks") or []
    configured = configured if isinstance(configured, list) else [configured]
    if any(isinstance(c, ProgressBar) for c in [*configured, *given]):
        return []  # the user's own choice of bar
    return [ProgressLinesBar()]
