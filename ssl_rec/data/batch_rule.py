"""``batch_size: auto``: a training batch size chosen from the number of training rows.

A fixed batch size fits one data size only: 4096 rows on a 3k-row labeled subset is one
optimizer step per epoch, 64 rows on 5M rows is 78k steps. The rule keeps about
:data:`AUTO_STEPS_PER_EPOCH` optimizer steps per epoch: ``B`` is the power of two nearest
to ``rows / AUTO_STEPS_PER_EPOCH``, clamped to ``[AUTO_MIN_BATCH, AUTO_MAX_BATCH]``
(``docs/data.md``, "Batch size and schedule", has the measurement behind the numbers).
"""

from __future__ import annotations

import math
from typing import Literal

AUTO: Literal["auto"] = "auto"
BatchSize = int | Literal["auto"]
"""A batch size option: rows per batch, or ``"auto"`` (:func:`auto_batch_size`)."""

AUTO_STEPS_PER_EPOCH = 64
AUTO_MIN_BATCH = 64
AUTO_MAX_BATCH = 4096
AUTO_EVAL_BATCH_SIZE = 4096
"""Evaluation batch of ``batch_size: auto`` without an ``eval_batch_size``: evaluation keeps
no activations for backward, so it takes the largest training batch the rule gives."""

__all__ = [
    "AUTO",
    "AUTO_EVAL_BATCH_SIZE",
    "AUTO_MAX_BATCH",
    "AUTO_MIN_BATCH",
    "AUTO_STEPS_PER_EPOCH",
    "BatchSize",
    "auto_batch_size",
    "check_batch_size",
]


def auto_batch_size(n_rows: int) -> int:
    """The training batch size of ``batch_size: auto`` for ``n_rows`` training rows.

    Args:
        n_rows: rows one epoch trains on (per process; the labeled subset when training on
            a fraction of the labels).

    Returns:
        The power of two nearest to ``n_rows / AUTO_STEPS_PER_EPOCH`` (nearest on a log
        scale), clamped to ``[AUTO_MIN_BATCH, AUTO_MAX_BATCH]``.

    Example:
        >>> auto_batch_size(3_000), auto_batch_size(20_000), auto_batch_size(5_000_000)
        (64, 256, 4096)

    """
    per_step = max(n_rows, 1) / AUTO_STEPS_PER_EPOCH
    nearest = 2 ** round(math.log2(per_step))
    return int(min(max(nearest, AUTO_MIN_BATCH), AUTO_MAX_BATCH))


def check_batch_size(owner: str, key: str, value: object) -> BatchSize:
    """Return ``value`` if it is an integer ``>= 1`` or ``"auto"``.

    Raises:
        ValueError: naming ``owner.key``, the value and what is allowed.

    """
    if value == AUTO:
        return AUTO
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValueError(f"{owner}.{key} must be an integer >= 1 or 'auto', got {value!r}")
