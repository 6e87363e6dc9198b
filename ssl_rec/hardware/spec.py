"""``TableSpec``: the per-table storage, cache and optimizer choice of a low-precision embedding."""

from __future__ import annotations

import math
from dataclasses import dataclass

PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8", "int4", "int2")
POLICIES: tuple[str, ...] = ("lru", "lfu")
OPTIMIZERS: tuple[str, ...] = ("sgd", "rowwise_adagrad")

__all__ = ["OPTIMIZERS", "POLICIES", "PRECISIONS", "TableSpec"]


def _check_choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"TableSpec.{key}={value!r} is not one of {list(allowed)}")


@dataclass(frozen=True)
class TableSpec:
    """How one embedding table is stored, cached and trained.

    Follows "Mixed-Precision Embedding Using a Cache" (Yang et al., 2020,
    https://arxiv.org/abs/2010.11305): rows live in a low-precision store, the hot
    ``cache_fraction`` of them in an FP32 cache; the optimizer step is fused into the
    embedding backward as in FBGEMM's table-batched embeddings.

    Args:
        precision: Storage format of the table: ``fp32 | fp16 | bf16 | int8 | int4 | int2``
            (integer formats are FBGEMM's row-wise asymmetric fused rows).
        cache_fraction: Fraction of the table's rows held in the FP32 cache, in ``[0, 1]``.
            Ignored for ``fp32`` tables (they are already full precision).
        cache_policy: Eviction policy of the set-associative cache: ``lru | lfu``.
        optimizer: Sparse optimizer fused into backward: ``sgd | rowwise_adagrad``.
        learning_rate: Step size of the fused optimizer, ``> 0``.
        stochastic_rounding: Round low-precision writes stochastically (unbiased) instead of
            to nearest.
        eps: Row-wise Adagrad denominator term, ``>= 0``.

    Example:
        >>> TableSpec(precision="int8", cache_fraction=0.05).cache_policy
        'lru'

    """

    precision: str = "fp32"
    cache_fraction: float = 0.0
    cache_policy: str = "lru"
    optimizer: str = "rowwise_adagrad"
    learning_rate: float = 0.05
    stochastic_rounding: bool = True
    eps: float = 1e-8

    def __post_init__(self) -> None:
        _check_choice("precision", self.precision, PRECISIONS)
        _check_choice("cache_policy", self.cache_policy, POLICIES)
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        if not (0.0 <= self.cache_fraction <= 1.0):
            raise ValueError(f"TableSpec.cache_fraction={self.cache_fraction!r} not in [0, 1]")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"TableSpec.learning_rate={self.learning_rate!r} must be > 0")
        if not (math.isfinite(self.eps) and self.eps >= 0):
            raise ValueError(f"TableSpec.eps={self.eps!r} must be >= 0")
        if not isinstance(self.stochastic_rounding, bool):
            raise ValueError(
                f"TableSpec.stochastic_rounding={self.stochastic_rounding!r} must be a bool"
            )

    @property
    def cached(self) -> bool:
        """Whether this spec gives the table an FP32 cache (non-fp32 storage, fraction > 0)."""
        return self.precision != "fp32" and self.cache_fraction > 0.0
