"""What preprocessing says about the values that map to the out-of-vocabulary id 0.

Two causes read alike in the ids and differ for the user: a value **rarer than
``min_frequency``** in the training split was seen and dropped on purpose (lower
``min_frequency`` to keep it), a value **never seen in training** is new data. Each log line
names both, with counts per field, and the split in the words of the command: rows a
``predict`` run scores are "predicting", not a "test split" (:func:`reporting_predictions`).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator, Mapping

log = logging.getLogger(__name__)
_PREDICTING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "ssl_rec_reporting_predictions", default=False
)
# How many fields a line names by count before "...".
_FIELDS_NAMED = 5


@contextlib.contextmanager
def reporting_predictions() -> Iterator[None]:
    """Within it, the rows of the ``test`` split are reported as the rows being predicted.

    ``ssl-rec predict`` makes every row of a new file a ``test`` row; its log should not
    talk about a test split the user never asked for.
    """
    token = _PREDICTING.set(True)
    try:
        yield
    finally:
        _PREDICTING.reset(token)


def split_title(split: str) -> str:
    """``"train split"``, ``"val split"``, ``"test split"``, or ``"predicting"``."""
    return "predicting" if split == "test" and _PREDICTING.get() else f"{split} split"


def _fields(counts: Mapping[str, int]) -> str:
    named = sorted(((n, c) for n, c in counts.items() if c), key=lambda kv: -kv[1])
    text = ", ".join(f"{name} {count}" for name, count in named[:_FIELDS_NAMED])
    return text + (", ..." if len(named) > _FIELDS_NAMED else "")


def describe_unseen(
    split: str,
    rows: int,
    unseen: Mapping[str, int],
    rare: Mapping[str, int | None] | None = None,
    min_frequency: int | None = None,
) -> str | None:
    """One line on the values of ``split`` a model's vocabulary maps to id 0, or ``None``.

    Args:
        split: ``"train"``, ``"val"`` or ``"test"``.
        rows: rows of the split.
        unseen: field -> non-missing values not in the vocabulary (mapped to id 0).
        rare: field -> how many of those were rarer than ``min_frequency`` in the
            vocabulary's training split (``None``: not recorded for that field); ``None``
            for no field.
        min_frequency: the vocabulary's ``min_frequency``; 1 means nothing was rare.

    """
    if not any(unseen.values()):
        return None
    rare_of, never, unknown = {}, {}, {}
    for name, count in unseen.items():
        known = 0 if min_frequency is not None and min_frequency <= 1 else None
        some = (rare or {}).get(name, known)
        if some is None:
            unknown[name] = count
        else:
            rare_of[name], never[name] = some, count - some
    parts = []
    if any(rare_of.values()):
        parts.append(f"{sum(rare_of.values())} values seen fewer than min_frequency="
                     f"{min_frequency} times in the model's training split "
                     f"({_fields(rare_of)})")  # fmt: skip
    if any(never.values()):
        parts.append(f"{sum(never.values())} values never seen in training ({_fields(never)})")
    if any(unknown.values()):
        parts.append(f"{sum(unknown.values())} values not in the model's vocabulary, rare in "
                     f"training or never seen there ({_fields(unknown)}; the vocabulary does "
                     "not record which)")  # fmt: skip
    return f"{split_title(split)} ({rows} rows): " + " and ".join(parts) + " map to id 0"


def report_unseen(
    split: str,
    rows: int,
    unseen: Mapping[str, int],
    rare: Mapping[str, int | None] | None = None,
    min_frequency: int | None = None,
) -> None:
    """Log :func:`describe_unseen`'s line as a warning (nothing when every value is known)."""
    line = describe_unseen(split, rows, unseen, rare, min_frequency)
    if line is not None:
        log.warning("%s", line)


def report_rare_in_training(rare_counts: Mapping[str, int | None], min_frequency: int) -> None:
    """Log how many distinct training values are rarer than ``min_frequency`` (id 0)."""
    known = {name: n for name, n in rare_counts.items() if n}
    if known:
        log.info(
            "%d distinct values seen fewer than min_frequency=%d times in the training split "
            "map to id 0 (%s)", sum(known.values()), min_frequency, _fields(known),
        )  # fmt: skip
