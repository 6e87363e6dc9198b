"""Input validation of the reference kernels: the twin of ``csrc/checks.cpp``.

Both kernel sets refuse the same inputs with the same exception types (``TypeError`` for a
dtype, ``ValueError`` for a shape or an inconsistent value, ``IndexError`` for an id out of
range), so no input can crash the process or read memory it does not own.
"""

from __future__ import annotations

import torch

from ssl_rec.hardware.kernels.table_meta import (
    CACHE_WAYS,
    HPARAM_COLUMNS,
    MAX_ADMISSION,
    META_ADMISSION,
    META_COLUMNS,
    META_DIM,
    META_KIND,
    META_OPTIMIZER,
    META_POLICY,
    META_ROWS,
    AdmittedBatch,
    TableTensors,
)
from ssl_rec.hardware.precision import Precision

MAX_DIM = 2048
_NUM_KINDS = len(Precision)

__all__ = ["check_bag", "check_grad", "check_ids", "check_plan", "check_tables"]


def _expect(x: torch.Tensor, dtype: torch.dtype, dims: int, what: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype != dtype:
        got = f"{x.dtype}{list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"{what} must be {dtype}, got {got}")
    if x.dim() != dims:
        raise ValueError(f"{what} must have {dims} dimensions, got {list(x.shape)}")
    if not x.is_contiguous() or x.device.type != "cpu":
        raise ValueError(f"{what} must be a contiguous CPU tensor")


def _expect_shape(x: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    if tuple(x.shape) != shape:
        raise ValueError(f"{what} must have shape {list(shape)}, got {list(x.shape)}")


def _check_table(t: TableTensors, f: int) -> tuple[int, int]:
    name = f"table {f}: "
    kind, policy, opt, rows, dim = (
        int(t.meta[f, c]) for c in (META_KIND, META_POLICY, META_OPTIMIZER, META_ROWS, META_DIM)
    )
    if not 0 <= kind < _NUM_KINDS:
        raise ValueError(f"{name}unknown format {kind}")
    if policy not in (0, 1) or opt not in (0, 1):
        raise ValueError(f"{name}unknown policy {policy} or optimizer {opt}")
    if not 1 <= int(t.meta[f, META_ADMISSION]) <= MAX_ADMISSION:
        raise ValueError(
            f"{name}admission count must be in [1, {MAX_ADMISSION}], "
            f"got {int(t.meta[f, META_ADMISSION])}"
        )
    if rows <= 0 or not 0 < dim <= MAX_DIM:
        raise ValueError(f"{name}rows must be > 0 and dim in [1, {MAX_DIM}], got {rows}, {dim}")
    p = Precision.from_code(kind)
    if not p.is_float and dim % (8 // p.bits):
        raise ValueError(f"{name}dim {dim} does not pack into whole bytes")
    _expect(t.stores[f], p.dtype, 2, name + "store")
    _expect_shape(t.stores[f], p.store_shape(rows, dim), name + "store")
    _expect(t.cache_tags[f], torch.int16, 2, name + "cache tags")
    sets = t.cache_tags[f].shape[0]
    _expect_shape(t.cache_tags[f], (sets, CACHE_WAYS), name + "cache tags")
    _expect(t.cache_rows[f], torch.float32, 2, name + "cache rows")
    _expect_shape(t.cache_rows[f], (sets * CACHE_WAYS, dim), name + "cache rows")
    _expect(t.cache_state[f], torch.uint8, 2, name + "cache state")
    _expect_shape(t.cache_state[f], (sets, 1 if policy == 0 else CACHE_WAYS), name + "cache state")
    if sets and (rows - 1) // sets > 32767:
        raise ValueError(f"{name}cache has too few sets for int16 tags")
    _expect(t.stats[f], torch.int64, 1, name + "stats")
    _expect_shape(t.stats[f], (4,), name + "stats")
    _expect(t.momentum[f], torch.float32, 1, name + "momentum")
    if opt == 1:
        _expect_shape(t.momentum[f], (rows,), name + "momentum")
    return rows, dim


def check_tables(t: TableTensors) -> list[tuple[int, int]]:
    """Validate every table; returns ``(rows, dim)`` per table."""
    _expect(t.meta, torch.int64, 2, "meta")
    if t.meta.shape[1] != META_COLUMNS:
        raise ValueError(f"meta must be int64[T, {META_COLUMNS}], got {list(t.meta.shape)}")
    n = t.meta.shape[0]
    _expect(t.hparams, torch.float32, 2, "hparams")
    _expect_shape(t.hparams, (n, HPARAM_COLUMNS), "hparams")
    lists = (t.stores, t.cache_rows, t.cache_tags, t.cache_state, t.stats, t.momentum)
    for tensors in lists:
        if len(tensors) != n:
            raise ValueError(f"got {len(tensors)} tensors in a table list for {n} tables")
    shapes = [_check_table(t, f) for f in range(n)]
    for f, (_, dim) in enumerate(shapes):
        if dim != shapes[0][1]:
            raise ValueError(f"table {f}: dim {dim} differs from table 0's {shapes[0][1]}")
    return shapes


def check_ids(ids: torch.Tensor, shapes: list[tuple[int, int]]) -> None:
    """int64[B, T] ids, each within its table: IndexError names table, id and sample."""
    _expect(ids, torch.int64, 2, "ids")
    if ids.shape[1] != len(shapes):
        raise ValueError(f"ids must be int64[B, {len(shapes)}], got {list(ids.shape)}")
    limits = torch.tensor([rows for rows, _ in shapes], dtype=torch.int64)
    bad = (ids < 0) | (ids >= limits)
    if bool(bad.any()):
        b, f = (int(v) for v in bad.nonzero()[0])
        raise IndexError(
            f"table {f}: id {int(ids[b, f])} out of range [0, {int(limits[f])}) at sample {b}"
        )


def check_plan(p: AdmittedBatch, t: TableTensors, shapes: list[tuple[int, int]], what: str) -> None:
    """A plan of ``admit`` for these tables (shapes, dtypes, rows, slots, inverse)."""
    n = len(shapes)
    _expect(p.inverse, torch.int32, 2, f"{what} inverse")
    batch = p.inverse.shape[1]
    _expect_shape(p.inverse, (n, batch), f"{what} inverse")
    _expect(p.rows, torch.int64, 2, f"{what} rows")
    _expect_shape(p.rows, (n, batch), f"{what} rows")
    _expect(p.slots, torch.int32, 2, f"{what} slots")
    _expect_shape(p.slots, (n, batch), f"{what} slots")
    _expect(p.num_unique, torch.int64, 1, f"{what} num_unique")
    _expect_shape(p.num_unique, (n,), f"{what} num_unique")
    for f, (rows, _) in enumerate(shapes):
        u = int(p.num_unique[f])
        if not 0 <= u <= batch:
            raise ValueError(f"{what}: table {f} has {u} unique rows for {batch} samples")
        r, s = p.rows[f, :u], p.slots[f, :u]
        if u and (int(r.min()) < 0 or int(r.max()) >= rows):
            raise IndexError(f"{what}: table {f}: row out of range [0, {rows})")
        capacity = t.cache_rows[f].shape[0]
        if u and (int(s.min()) < -1 or int(s.max()) >= capacity):
            raise IndexError(f"{what}: table {f}: slot out of range")
        inv = p.inverse[f]
        if batch and (int(inv.min()) < 0 or int(inv.max()) >= u):
            raise IndexError(f"{what}: a sample of table {f} points beyond its {u} unique rows")


def check_grad(grad: torch.Tensor, p: AdmittedBatch, shapes: list[tuple[int, int]]) -> None:
    """float32[B, T, D] gradient of a plan's output."""
    _expect(grad, torch.float32, 3, "grad")
    dim = shapes[0][1] if shapes else 0
    _expect_shape(grad, (p.inverse.shape[1], len(shapes), dim), "grad")


def check_bag(
    store: torch.Tensor, bits: int, indices: torch.Tensor, offsets: torch.Tensor, dim: int
) -> None:
    """A bag lookup's store, indices and ``offsets`` (B + 1 bounds from 0 to N, monotone)."""
    if bits not in (8, 4):
        raise ValueError(f"bag_lookup: bits must be 8 or 4, got {bits}")
    _expect(store, torch.uint8, 2, "store")
    p = Precision.int8 if bits == 8 else Precision.int4
    if not 0 < dim <= MAX_DIM or dim % (8 // bits) or store.shape[1] != p.row_bytes(dim):
        raise ValueError(
            f"store rows of {store.shape[1]} bytes do not hold {bits}-bit rows of dim {dim}"
        )
    _expect(indices, torch.int64, 1, "indices")
    _expect(offsets, torch.int64, 1, "offsets")
    n = indices.numel()
    if offsets.numel() < 1:
        raise ValueError("offsets must hold B + 1 >= 1 bag boundaries")
    if int(offsets[0]) != 0:
        raise ValueError(f"offsets[0] must be 0, got {int(offsets[0])}")
    if int(offsets[-1]) != n:
        raise ValueError(
            f"offsets[-1] must equal the number of indices {n}, got {int(offsets[-1])}"
        )
    drops = (offsets[:-1] > offsets[1:]).nonzero()  # a comparison: no step can wrap
    if len(drops):
        b = int(drops[0])
        raise ValueError(
            f"offsets must be non-decreasing: offsets[{b}] = {int(offsets[b])} > "
            f"offsets[{b + 1}] = {int(offsets[b + 1])}"
        )
    bad = ((indices < 0) | (indices >= store.shape[0])).nonzero()
    if len(bad):
        i = int(bad[0])
        raise IndexError(f"indices[{i}] = {int(indices[i])} out of range [0, {store.shape[0]})")
