"""Rows held in memory, the models' logits on them, their metrics, and serving speed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ssl_rec.metrics import ctr_summary, normalized_entropy
from ssl_rec.types import Batch

__all__ = ["Rows", "logits_of", "ne_of", "pair_agreement", "summary", "throughput"]

Model = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Rows:
    """Labeled rows in memory: ``dense float32[N, n]``, ``sparse int64[N, F]``, ``label [N]``."""

    dense: torch.Tensor
    sparse: torch.Tensor
    label: torch.Tensor

    @classmethod
    def from_batches(cls, batches: Iterable[Batch], max_rows: int, where: str) -> Rows:
        """The first ``max_rows`` labeled rows of ``batches``.

        Rows labeled NaN (the unlabeled rows of a semi-supervised batch) are skipped.

        Raises:
            ValueError: naming ``where`` when there are no labeled rows or no labels.

        """
        parts: list[Batch] = []
        count = 0
        for batch in batches:
            if batch.label is None:
                raise ValueError(f"{where}: rows have no labels; this needs labeled rows")
            labeled = torch.isfinite(batch.label)
            if not bool(labeled.all()):
                batch = batch.rows(labeled)
            parts.append(batch.head(max_rows - count))
            count += parts[-1].batch_size
            if count >= max_rows:
                break
        if count == 0:
            raise ValueError(f"{where}: no rows with a label (an empty split?)")
        return cls(
            torch.cat([b.dense for b in parts]).float(),
            torch.cat([b.sparse for b in parts]).long(),
            torch.cat([b.label for b in parts]).float(),
        )

    def __len__(self) -> int:
        return int(self.label.shape[0])

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(dense, sparse)`` of rows ``start .. start + size`` (wrapping around)."""
        index = torch.arange(start, start + size) % len(self)
        return self.dense[index], self.sparse[index]


@torch.inference_mode()
def logits_of(model: Model, rows: Rows, batch_size: int = 4096) -> torch.Tensor:
    """``float32[N]`` logits of ``model`` on every row, ``batch_size`` rows at a time."""
    out = [
        model(rows.dense[s : s + batch_size], rows.sparse[s : s + batch_size])
        for s in range(0, len(rows), batch_size)
    ]
    return torch.cat(out).float()


def ne_of(logits: torch.Tensor, label: torch.Tensor) -> float:
    """Normalized entropy of ``logits float[N]`` (binary cross-entropy in float64)."""
    logloss = F.binary_cross_entropy_with_logits(logits.double(), label.double())
    return normalized_entropy(float(logloss), float(label.double().mean()))


def summary(logits: torch.Tensor, label: torch.Tensor) -> dict[str, float]:
    """``ne`` (as :func:`ne_of`), ``auc``, ``logloss``, ``calibration`` and ``ctr``."""
    out = ctr_summary(torch.sigmoid(logits.double()).numpy(), label.double().numpy())
    out["ne"] = ne_of(logits, label)
    return out


def pair_agreement(a: torch.Tensor, b: torch.Tensor, pairs: int = 200_000, seed: int = 0) -> float:
    """Fraction of random row pairs that two score vectors ``float[N]`` order the same way.

    Pairs tied in either vector count as agreeing only when tied in both.
    """
    if a.shape != b.shape or a.numel() < 2:
        raise ValueError(
            f"pair_agreement needs two score vectors of one shape with N >= 2, "
            f"got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    gen = np.random.default_rng(seed)
    i, j = gen.integers(0, a.numel(), (2, pairs))
    keep = i != j
    x, y = a.double().numpy(), b.double().numpy()
    same = np.sign(x[i] - x[j]) == np.sign(y[i] - y[j])
    return float(same[keep].mean())


@torch.inference_mode()
def throughput(
    models: Mapping[str, Model], rows: Rows, batch_size: int, threads: int = 1, rounds: int = 15
) -> dict[str, dict[str, float]]:
    """Samples/s and latency of each model on ``batch_size``-row batches, interleaved.

    Models run round by round in turn on the same batches, so a load change on a shared
    machine hits them alike. Returns ``{name: {"samples_per_s", "p50_ms", "p99_ms",
    "samples_per_cpu_s"}}``: samples/s from the median wall-clock latency, and from the
    median CPU time the process spent per batch (less sensitive to other processes taking
    the cores, as long as they leave the caches alone).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in models}
    try:
        batches = [rows.batch(r * batch_size, batch_size) for r in range(min(rounds, 8))]
        for model in models.values():  # warm-up: first-call allocations and kernel choice
            model(*batches[0])
        for r in range(rounds):
            for name, model in models.items():
                start, cpu = time.perf_counter(), time.process_time()
                model(*batches[r % len(batches)])
                times[name].append((time.perf_counter() - start, time.process_time() - cpu))
    finally:
        torch.set_num_threads(previous)
    out = {}
    for name, measured in times.items():
        wall, cpu = np.array(measured).T
        p50, p99 = np.percentile(wall, [50, 99])
        out[name] = {
            "samples_per_s": batch_size / p50,
            "p50_ms": 1e3 * p50,
            "p99_ms": 1e3 * p99,
            "samples_per_cpu_s": batch_size / max(float(np.median(cpu)), 1e-9),
        }
    return out
