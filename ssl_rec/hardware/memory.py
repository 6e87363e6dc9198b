"""Byte accounting of low-precision cached tables.

Shared by ``memory_report`` and ``estimate_memory``, so a Criteo-sized estimate uses exactly
the code that measures a real instance.
"""

from __future__ import annotations

from collections.abc import Sequence

from ssl_rec.hardware.cache import cache_geometry, cache_metadata_bytes
from ssl_rec.hardware.kernels.table_meta import CACHE_WAYS
from ssl_rec.hardware.spec import TableSpec

KEYS: tuple[str, ...] = (
    "quantized_rows",
    "scales_biases",
    "cache_rows",
    "cache_metadata",
    "optimizer_state",
    "total_bytes",
    "fp32_bytes",
)

__all__ = ["estimate_memory", "summarize", "table_memory"]


def table_memory(
    num_rows: int, dim: int, spec: TableSpec, sets: int | None = None
) -> dict[str, int]:
    """Bytes of one table.

    ``total_bytes`` counts what holds the weights (store, scales/biases, cache rows, cache
    metadata); ``optimizer_state`` (row-wise Adagrad: 4 bytes per row) is reported beside
    it, as is ``fp32_bytes = R * D * 4``, the plain FP32 table.

    Args:
        num_rows: Rows R as stored (``R * k`` for a table with ``k`` column blocks).
        dim: Width of the stored rows (``D / k`` with ``k`` column blocks).
        spec: Storage spec.
        sets: Cache sets (default: ``cache_geometry(num_rows, spec)``; a row-wise shard holds
            its share of the logical table's sets).

    Returns:
        A dict with the keys of ``KEYS``.

    """
    stored = num_rows * spec.precision.row_bytes(dim)
    scales = num_rows * spec.precision.qparam_bytes
    sets = cache_geometry(num_rows, spec) if sets is None else sets
    report = {
        "quantized_rows": stored - scales,
        "scales_biases": scales,
        "cache_rows": sets * CACHE_WAYS * dim * 4,
        "cache_metadata": cache_metadata_bytes(sets, spec.cache_policy),
        "optimizer_state": num_rows * 4 if spec.optimizer == "rowwise_adagrad" else 0,
        "fp32_bytes": num_rows * dim * 4,
    }
    weights = ("quantized_rows", "scales_biases", "cache_rows", "cache_metadata")
    report["total_bytes"] = sum(report[k] for k in weights)
    return {k: report[k] for k in KEYS}


def summarize(tables: list[dict[str, int]]) -> dict:
    """Per-table reports, their total, and the compression ratio ``fp32 / total``.

    ``compression_with_optimizer`` counts the optimizer state on both sides.

    Args:
        tables: Outputs of :func:`table_memory`.

    Returns:
        ``{"tables": [...], "total": {...}, "compression": float,
        "compression_with_optimizer": float}``.

    """
    total = {k: sum(t[k] for t in tables) for k in KEYS}
    ratio = total["fp32_bytes"] / total["total_bytes"] if total["total_bytes"] else 1.0
    # Both sides carry the same optimizer state (an FP32 table trained by row-wise Adagrad
    # has it too), which narrows the ratio.
    state = total["optimizer_state"]
    with_state = (total["fp32_bytes"] + state) / (total["total_bytes"] + state)
    return {
        "tables": tables,
        "total": total,
        "compression": ratio,
        "compression_with_optimizer": with_state if total["total_bytes"] else 1.0,
    }


def estimate_memory(
    cardinalities: Sequence[int], dim: int, specs: Sequence[TableSpec] | TableSpec
) -> dict:
    """Memory report of a collection without allocating it.

    Args:
        cardinalities: Rows per table.
        dim: Embedding dimension D.
        specs: One spec per table, or one for all.

    Returns:
        Same structure as ``MixedPrecisionEmbeddingCollection.memory_report()``.

    Example:
        >>> r = estimate_memory([10_000_000], 64, TableSpec("int8", 0.05))
        >>> round(r["compression"], 2)
        3.02

    """
    if isinstance(specs, TableSpec):
        specs = [specs] * len(cardinalities)
    if len(specs) != len(cardinalities):
        raise ValueError(f"len(specs)={len(specs)} != len(cardinalities)={len(cardinalities)}")
    pairs = zip(cardinalities, specs, strict=True)
    return summarize([table_memory(*s.stored_shape(r, dim), s) for r, s in pairs])
