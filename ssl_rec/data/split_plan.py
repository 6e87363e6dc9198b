"""Which rows of which input file go to which split.

Three layouts, each a list of :class:`Part` s in a fixed order:

- one file (or a directory with only ``train*`` files, like Criteo-Kaggle's ``train.txt``
  plus its unlabeled ``test.txt``): rows are drawn at random into train / val / test with
  ``val_fraction`` / ``test_fraction`` (one seeded stream over the rows in file order);
- a directory with ``train*`` / ``val*`` / ``test*`` files: each file is its split; a
  split with no labeled file of its own is drawn at random from the training files;
- day files (``day_0 .. day_23``, a directory of other names, or a list): every day but
  the last trains; the last is cut in halves, test first and val second (the MLPerf
  convention on Criteo Terabyte: day 23).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

SPLITS = ("train", "val", "test")
MODES = (*SPLITS, "random", "halves")
# File stems that name a split in a directory of files (train.csv, valid.txt.gz, ...).
SPLIT_NAMES = {"train": "train", "valid": "val", "val": "val", "validation": "val", "test": "test"}
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Part:
    """One input file and where its rows go.

    Args:
        path: the file.
        mode: ``train`` / ``val`` / ``test`` (all rows), ``random`` (drawn per row) or
            ``halves`` (first half test, second half val).
        labeled: whether the file has the label column.

    """

    path: str
    mode: str
    labeled: bool = True

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"Part.mode must be one of {MODES}, got {self.mode!r}")

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits this part can feed."""
        return {"random": SPLITS, "halves": ("test", "val")}.get(self.mode, (self.mode,))


@dataclass(frozen=True)
class SplitPlan:
    """The parts of a data set, in order, and the fractions of the random draw.

    Args:
        parts: input files in reading order.
        val_fraction: probability that a row of a ``random`` part goes to val.
        test_fraction: probability that it goes to test.
        seed: seed of the draw.

    """

    parts: tuple[Part, ...]
    val_fraction: float = 0.0
    test_fraction: float = 0.0
    seed: int = 0

    def files(self, split: str) -> list[str]:
        """Files feeding ``split``."""
        return [p.path for p in self.parts if split in self.splits_of(p)]

    def splits_of(self, part: Part) -> tuple[str, ...]:
        """Splits a part actually feeds (a random draw with fraction 0 feeds nothing)."""
        if part.mode != "random":
            return part.splits
        fractions = {"train": 1.0, "val": self.val_fraction, "test": self.test_fraction}
        return tuple(s for s in SPLITS if fractions[s] > 0)

    def labeled(self, split: str) -> bool:
        """Whether every file of ``split`` has labels (``ValueError`` if they disagree)."""
        flags = {p.labeled for p in self.parts if split in self.splits_of(p)}
        if len(flags) > 1:
            raise ValueError(f"split {split!r} mixes labeled and unlabeled files: "
                             f"{self.files(split)}")  # fmt: skip
        return flags.pop() if flags else True

    def to_dict(self) -> dict:
        """JSON-able form (part of the cache key and the schema metadata)."""
        return {"parts": [[p.path, p.mode, p.labeled] for p in self.parts],
                "val_fraction": self.val_fraction, "test_fraction": self.test_fraction,
                "seed": self.seed}  # fmt: skip


class SplitDraw:
    """The seeded per-row draw of ``random`` parts: one stream over their rows in order.

    ``numpy.random.Generator.random`` draws the same numbers in one call of ``n`` or in
    batches summing to ``n``, so the assignment never depends on the batch size.
    """

    def __init__(self, plan: SplitPlan) -> None:
        self.val, self.test = plan.val_fraction, plan.test_fraction
        self._rng = np.random.default_rng(plan.seed)

    def __call__(self, n: int) -> np.ndarray:
        """``int8[n]`` split index (0 train, 1 val, 2 test) of the next ``n`` rows."""
        r = self._rng.random(n)
        return np.where(r < self.test, 2, np.where(r < self.test + self.val, 1, 0)).astype(np.int8)


def half_of(rows: int) -> int:
    """Rows of the first (test) half of a ``halves`` part: ``ceil(rows / 2)``."""
    return math.ceil(rows / 2)


def natural_key(path: str) -> list[object]:
    """Sort key putting ``day_2`` before ``day_10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", Path(path).name)]


def split_name(path: str) -> str | None:
    """``train`` / ``val`` / ``test`` when a file's name says so (``valid_1.txt.gz``), else None."""
    stem = Path(path).name.split(".")[0].split("_")[0].split("-")[0].lower()
    return SPLIT_NAMES.get(stem)


def plan_days(files: list[str], labeled: Callable[[str], bool]) -> SplitPlan:
    """Every day but the last trains; the last is cut in halves (test, then val)."""
    if len(files) < 2:
        raise ValueError(f"day files need at least 2 files (train days + one cut in halves), "
                         f"got {len(files)}: {files}")  # fmt: skip
    files = sorted(files, key=natural_key)
    parts = [Part(f, "train", labeled(f)) for f in files[:-1]]
    return SplitPlan((*parts, Part(files[-1], "halves", labeled(files[-1]))))


def plan_named(
    named: dict[str, list[str]],
    labeled: Callable[[str], bool],
    val_fraction: float,
    test_fraction: float,
    seed: int,
) -> SplitPlan:
    """Files named by split; a split without a labeled file is drawn from the training files."""
    if not named.get("train"):
        raise ValueError(f"no training file among {sorted(sum(named.values(), []))}")
    keep = {s: sorted(named.get(s, []), key=natural_key) for s in SPLITS}
    drawn = {"val": 0.0, "test": 0.0}
    train_labeled = all(labeled(f) for f in keep["train"])
    for split in ("val", "test"):
        if train_labeled and keep[split] and not all(labeled(f) for f in keep[split]):
            log.info("%s has no labels: the %s split is drawn from the training rows instead "
                     "(fraction %s)", keep[split], split,
                     val_fraction if split == "val" else test_fraction)  # fmt: skip
            keep[split] = []
        if not keep[split]:
            drawn[split] = val_fraction if split == "val" else test_fraction
    train_mode = "random" if any(drawn.values()) else "train"
    parts = [Part(f, train_mode, labeled(f)) for f in keep["train"]]
    parts += [Part(f, s, labeled(f)) for s in ("val", "test") for f in keep[s]]
    return SplitPlan(tuple(parts), drawn["val"], drawn["test"], seed)


def plan_single(path: str, labeled: bool, val_fraction: float, test_fraction: float,
                seed: int) -> SplitPlan:  # fmt: skip
    """One file drawn at random into train / val / test."""
    return SplitPlan((Part(path, "random", labeled),), val_fraction, test_fraction, seed)


def split_columns(plan: SplitPlan, split: str, read: Callable[[str], pa.Table]) -> pa.Table:
    """Columns ``read(path)`` of ``split``'s rows, in the order preprocessing wrote them.

    Replays the plan: the one draw over the ``random`` parts' rows, the cut of ``halves``
    parts. Bad rows must not have been skipped (rows would no longer line up).
    """
    draw, tables, index = SplitDraw(plan), [], SPLITS.index(split)
    for part in plan.parts:
        if part.mode == "random":
            table = read(part.path)
            rows = draw(table.num_rows) == index
            if split in plan.splits_of(part):
                tables.append(table.filter(pa.array(rows)))
        elif part.mode == "halves" and split in part.splits:
            table = read(part.path)
            half = half_of(table.num_rows)
            tables.append(table.slice(0, half) if split == "test" else table.slice(half))
        elif part.mode == split:
            tables.append(read(part.path))
    if not tables:
        raise ValueError(f"no input file feeds the {split!r} split")
    return pa.concat_tables(tables)
