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


def decided_per_column(option: str | Mapping[str, str]) -> bool:
    """Whether ``option`` transforms columns while rows are encoded (``auto`` or a mapping)."""
    return not isinstance(option, str) or option == AUTO_TRANSFORM


def parse_time_transform(option: str | Mapping[str, str]) -> str:
    """The transform the file reader applies: the option's name, else ``"none"`` (raw values)."""
    return "none" if decided_per_column(option) else option


def auto_transforms(columns: Sequence[str], minimum: np.ndarray) -> dict[str, str]:
    """``auto``'s choice per column: ``log1p`` where the training rows' ``minimum`` is >= 0."""
    return {c: "log1p" if m >= 0.0 else "none" for c, m in zip(columns, minimum, strict=True)}


def column_transforms(option: str | Mapping[str, str], columns: Sequence[str]) -> dict[str, str]:
    """The transform of every dense column, in column order, for a name or a mapping.

    Raises:
        ValueError: a mapping that misses a column or names one the data does not have.

    """
    if isinstance(option, str):
        return dict.fromkeys(columns, option)
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
    """``float32[N, n_dense]`` raw values (missing 0) with each column's transform applied.

    Columns left as read are not copied; ``dense`` itself comes back when all are.
    """
    logged = [j for j, name in enumerate(transforms) if name != "none"]
    if not logged:
        return dense
    out = dense.copy()
    for j in logged:
        out[:, j] = transformed(dense[:, j].astype(np.float64), transforms[j])
    return out


class ColumnMinimum:
    """The running minimum of each dense column over the batches it is shown."""

    def __init__(self, n_dense: int) -> None:
        self.value = np.full(n_dense, np.inf)

    def add(self, dense: np.ndarray) -> None:
        """Fold in ``float[N, n_dense]`` rows."""
        if len(dense):
            self.value = np.minimum(self.value, dense.min(axis=0))
