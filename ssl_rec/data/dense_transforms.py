"""What each dense column's values become: one transform for all, one per column, or ``auto``.

``preprocess.dense_transform`` is a transform name for every column (``"log1p"``,
``"signed_log1p"``, ``"none"``: applied while a file is parsed), a mapping ``column ->
name``, or ``"auto"``: ``log1p`` for a column whose training values are all >= 0 (counts,
prices, durations: DLRM's transform), ``none`` for one with a negative value (a balance, a
temperature, a score: a log would bend a linear effect into a step). Per-column transforms
are applied when rows are encoded, after the training rows' minima are known; the resolved
mapping is recorded in the schema and in the data module's hyper-parameters, so a checkpoint
transforms new data as it was trained.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ssl_rec.data.parsing import DENSE_TRANSFORMS, transformed

AUTO_TRANSFORM = "auto"
TRANSFORMS_KEY = "dense_transforms"


def check_dense_transform_option(value: Any) -> str | dict[str, str]:
    """Return ``value`` (a name, ``"auto"`` or ``column -> name``) or raise ``ValueError``."""
    if isinstance(value, str) and value in (*DENSE_TRANSFORMS, AUTO_TRANSFORM):
        return value
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        for column, name in value.items():
            if name not in DENSE_TRANSFORMS:
                raise ValueError(f"dense_transform of column {column!r} must be one of "
                                 f"{DENSE_TRANSFORMS}, got {name!r}")  # fmt: skip
        return dict(value)
    raise ValueError(
        f"dense_transform must be one of {(*DENSE_TRANSFORMS, AUTO_TRANSFORM)} or a mapping "
        f"column -> one of {DENSE_TRANSFORMS}, got {value!r}"
    )


def parse_time_transform(option: str | Mapping[str, str]) -> str:
    """The transform the file reader applies: the option's name, else ``"none"`` (raw values)."""
    return option if isinstance(option, str) and option != AUTO_TRANSFORM else "none"


def needs_minimum(option: str | Mapping[str, str]) -> bool:
    """Whether resolving ``option`` needs the training rows' minimum per column."""
    return option == AUTO_TRANSFORM


def auto_transform(minimum: float) -> str:
    """``log1p`` where a column's training values are all >= 0, else ``none``."""
    return "log1p" if minimum >= 0.0 else "none"


def column_transforms(
    option: str | Mapping[str, str], columns: Sequence[str], minimum: np.ndarray | None = None
) -> dict[str, str]:
    """The transform of every dense column, in column order.

    Args:
        option: ``preprocess.dense_transform``.
        columns: the dense column names.
        minimum: ``float[len(columns)]``, the training rows' smallest raw value per column
            (``inf`` where there was none); needed for ``"auto"``.

    Raises:
        ValueError: a mapping that misses a column or names one the data does not have.

    """
    if isinstance(option, str) and option != AUTO_TRANSFORM:
        return dict.fromkeys(columns, option)
    if option == AUTO_TRANSFORM:
        if minimum is None:
            raise ValueError("dense_transform 'auto' needs the training rows' minima")
        return {c: auto_transform(float(m)) for c, m in zip(columns, minimum, strict=True)}
    missing = [c for c in columns if c not in option]
    unknown = [c for c in option if c not in columns]
    if missing or unknown:
        raise ValueError(
            f"dense_transform names columns {sorted(option)}, the data's dense columns are "
            f"{list(columns)}" + (f" (missing: {missing})" if missing else "")
            + (f" (unknown: {unknown})" if unknown else "")
        )  # fmt: skip
    return {c: option[c] for c in columns}


def apply_column_transforms(dense: np.ndarray, transforms: Sequence[str]) -> np.ndarray:
    """``float32[N, n_dense]`` raw values (missing 0) with each column's transform applied."""
    out = np.empty_like(dense, dtype=np.float32)
    for j, name in enumerate(transforms):
        out[:, j] = transformed(dense[:, j].astype(np.float64), name)
    return out


class ColumnMinimum:
    """The running minimum of each dense column over the batches it is shown."""

    def __init__(self, n_dense: int) -> None:
        self.value = np.full(n_dense, np.inf)

    def add(self, dense: np.ndarray) -> None:
        """Fold in ``float[N, n_dense]`` rows."""
        if len(dense):
            self.value = np.minimum(self.value, dense.min(axis=0))
