"""Selection on validation only and summaries over seeds, shared by the accuracy studies.

A run is ``(best validation AUC, thunk computing the test AUC of that state)``: studies
train every variant, choose by mean validation AUC over seeds, and call the thunk of the
chosen variant only, so test AUC is computed once per final setting.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable

import pytorch_lightning as pl

Run = tuple[float, Callable[[], float]]


class BestValAUC(pl.Callback):
    """Keep the weights (tables included) of the epoch with the best validation AUC."""

    def __init__(self) -> None:
        self.best, self.state = -1.0, None

    def on_validation_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        auc = float(trainer.callback_metrics.get("val/auc", -1.0))
        if auc > self.best:
            self.best, self.state = auc, copy.deepcopy(module.state_dict())


def mean_std(values: list[float]) -> dict[str, float]:
    """``{"mean", "std"}`` of ``values`` (sample standard deviation; 0 for one value)."""
    return {"mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0}  # fmt: skip


def seed_diffs(a: dict, b: dict) -> dict:
    """Per-seed differences ``a[s] - b[s]`` over the seeds of both: ``mean``, ``std``,
    ``wins`` (differences above 0), ``n`` and the ``diffs``."""
    diffs = [a[s] - b[s] for s in a if s in b]
    return {**mean_std(diffs), "wins": sum(d > 0 for d in diffs), "n": len(diffs),
            "diffs": diffs}  # fmt: skip


def choose(val: dict[str, dict[str, float]]) -> str:
    """The variant of best mean validation AUC; ``val`` is ``variant -> seed -> val AUC``."""
    return max(val, key=lambda v: statistics.fmean(val[v].values()))


def summary(chosen: str, val: dict[str, dict[str, float]], tests: dict[str, float]) -> dict:
    """A setting's record: every variant's validation AUC, the chosen one's test AUC per seed.

    Returns:
        ``chosen``, ``variants_val_auc``, ``test_auc`` (seed -> AUC), ``mean``, ``std`` (sample).

    """
    return {"chosen": chosen, "variants_val_auc": val, "test_auc": tests,
            **mean_std(list(tests.values()))}  # fmt: skip


def select(runs: dict[str, dict[int, Run]]) -> dict:
    """Choose the variant of best mean validation AUC; compute test AUC for it only.

    Args:
        runs: ``variant -> seed -> Run``.

    Returns:
        :func:`summary` of the chosen variant.

    """
    val = {v: {str(s): r[0] for s, r in per.items()} for v, per in runs.items()}
    chosen = choose(val)
    return summary(chosen, val, {str(s): r[1]() for s, r in runs[chosen].items()})


def paired(results: dict, a: str, b: str, key: str) -> dict | None:
    """Per-seed test-AUC differences ``a - b`` at ``key`` (same seeds, same labeled rows)."""
    if key not in results.get(a, {}) or key not in results.get(b, {}):
        return None
    return seed_diffs(results[a][key]["test_auc"], results[b][key]["test_auc"])


def table(results: dict, keys: list[str], label: Callable[[str], str]) -> str:
    """Markdown table: one row per model, ``mean ± std`` per key, the chosen variants."""
    lines = [
        "| model | " + " | ".join(label(k) for k in keys) + " | chosen variant |",
        "|---|" + "---|" * (len(keys) + 1),
    ]
    for name, per in results.items():
        if not isinstance(per, dict) or not all(isinstance(v, dict) for v in per.values()):
            continue
        cells = [f"{per[k]['mean']:.4f} ± {per[k]['std']:.4f}" if k in per else "n/a" for k in keys]
        chosen = "; ".join(dict.fromkeys(per[k]["chosen"] for k in keys if k in per))
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {chosen} |")
    return "\n".join(lines)
