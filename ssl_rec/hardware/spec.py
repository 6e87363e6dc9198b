"""``TableSpec``: the per-table storage, cache and optimizer choice of a low-precision embedding."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ssl_rec._checks import check_at_least, check_choice, check_nonnegative, check_positive
from ssl_rec.hardware.precision import Precision

POLICIES: tuple[str, ...] = ("lru", "lfu")
OPTIMIZERS: tuple[str, ...] = ("sgd", "rowwise_adagrad")

__all__ = ["OPTIMIZERS", "POLICIES", "TableSpec"]


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
        store_dir: Directory for the low-precision store as a memory-mapped file (one per
            table, deleted when the process ends): tables larger than RAM train with only
            the FP32 cache, the optimizer state and the touched pages in memory, and the
            cache's hit rate decides the speed. ``None`` keeps the store in RAM.
        admission_count: A row missing from the cache enters it only when the batch looks
            it up at least this many times (or the way it would take is empty); other
            misses are read from and updated in the store, so a row seen once does not
            evict one that may be hot. ``1`` admits every miss. Measured in
            ``docs/hardware.md`` ("Cache", admission count): 2 raises the hit rate and
            removes most evictions at the same accuracy.
        weight_decay: L2 weight decay of the fused optimizer, ``>= 0``: each row a batch
            updates gets ``weight_decay * w`` (``w`` its current value) added to its summed
            gradient before the SGD or row-wise Adagrad step, as FBGEMM's
            ``weight_decay_mode`` L2 does. Lazy: rows the batch does not look up (or whose
            gradient is exactly zero) do not decay. ``0`` is the plain optimizer.
        column_blocks: Column blocks ``k`` of each row, ``>= 1``: the ``D`` values of a row
            are stored as ``k`` blocks of ``D / k``, each quantized (scale and bias), cached
            and given a row-wise Adagrad state of its own; the table is kept as an
            ``[R * k, D / k]`` table (logical row ``r``, block ``b`` -> row ``r * k + b``).
            ``D`` must divide by ``k``. Blocks let ``column_wise`` sharding put a table's
            columns on several ranks (docs/scale-out.md). ``1`` is the plain table.

    Example:
        >>> TableSpec(precision="int8", cache_fraction=0.05).cache_policy
        'lru'

    """

    precision: Precision = Precision.fp32
    cache_fraction: float = 0.0
    cache_policy: str = "lru"
    optimizer: str = "rowwise_adagrad"
    learning_rate: float = 0.05
    stochastic_rounding: bool = True
    eps: float = 1e-8
    store_dir: str | None = None
    admission_count: int = 2
    weight_decay: float = 0.0
    column_blocks: int = 1

    def __post_init__(self) -> None:
        owner = "TableSpec"
        precision = check_choice(
            owner, "precision", str(self.precision), [p.value for p in Precision]
        )
        object.__setattr__(self, "precision", Precision(precision))
        check_choice(owner, "cache_policy", self.cache_policy, POLICIES)
        check_choice(owner, "optimizer", self.optimizer, OPTIMIZERS)
        count = check_at_least(owner, "admission_count", self.admission_count)
        object.__setattr__(self, "admission_count", count)
        blocks = check_at_least(owner, "column_blocks", self.column_blocks)
        object.__setattr__(self, "column_blocks", blocks)
        if not (0.0 <= self.cache_fraction <= 1.0):
            raise ValueError(
                f"TableSpec.cache_fraction must be in [0, 1], got {self.cache_fraction}"
            )
        check_positive(owner, "learning_rate", self.learning_rate)
        check_nonnegative(owner, "eps", self.eps)
        decay = check_nonnegative(owner, "weight_decay", self.weight_decay)
        object.__setattr__(self, "weight_decay", decay)
        if not isinstance(self.stochastic_rounding, bool):
            raise ValueError(
                f"TableSpec.stochastic_rounding must be a bool, got {self.stochastic_rounding!r}"
            )
        if self.store_dir is not None and (
            not isinstance(self.store_dir, str) or not self.store_dir
        ):
            raise ValueError(
                f"TableSpec.store_dir must be a directory path or None, got {self.store_dir!r}"
            )

    def to_dict(self) -> dict:
        """Plain-value form (precision as its name), the inverse of ``TableSpec(**d)``.

        ``column_blocks`` is left out at its default 1, so an unblocked table's saved spec is
        the one written before column blocks existed.
        """
        out = {**dataclasses.asdict(self), "precision": self.precision.value}
        if self.column_blocks == 1:
            del out["column_blocks"]
        return out

    def layout(self) -> tuple[str, float, str, str, int]:
        """What shapes the tensors: precision, cache fraction, policy, optimizer, blocks."""
        return (self.precision.value, self.cache_fraction, self.cache_policy, self.optimizer,
                self.column_blocks)  # fmt: skip

    def stored_shape(self, num_rows: int, dim: int, name: str = "table") -> tuple[int, int]:
        """Rows and width ``(R * k, D / k)`` the kernels see for a logical ``[R, D]`` table.

        Raises:
            ValueError: ``dim`` does not divide by ``column_blocks`` (names ``name``), or a
                block is narrower than the storage format allows.

        """
        k = self.column_blocks
        if dim % k:
            raise ValueError(
                f"{name}: embedding_dim {dim} does not divide into column_blocks={k} "
                "(TableSpec.column_blocks must divide D)"
            )
        if k > 1:
            try:
                self.precision.check_dim(dim // k)
            except ValueError as err:
                raise ValueError(
                    f"{name}: column_blocks={k} blocks of width {dim // k}: {err}"
                ) from None
        return num_rows * k, dim // k

    @property
    def cached(self) -> bool:
        """Whether this spec gives the table an FP32 cache (non-fp32 storage, fraction > 0)."""
        return self.precision is not Precision.fp32 and self.cache_fraction > 0.0
