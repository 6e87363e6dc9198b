"""``EmbeddingTable``: the buffers of one low-precision table (store, cache, optimizer state).

Tables are buffers, not Parameters, so no dense optimizer ever sees them; the fused
backward kernels update them in place. A table knows its ``stream`` and, through a
:class:`RowShard`, which global rows it holds (``offset + local_row * stride``): the
stochastic-rounding RNG is keyed by global rows, so the shards of a split logical table draw
the same random numbers as the unsplit table.
"""

from __future__ import annotations

import os
import tempfile
from typing import NamedTuple

import torch

from ssl_rec.hardware import huge_pages
from ssl_rec.hardware.buffer_epoch import TracksReplacement
from ssl_rec.hardware.cache import RowCache
from ssl_rec.hardware.kernels.table_meta import MAX_ADMISSION, OPTIMIZER_CODES, POLICY_CODES
from ssl_rec.hardware.memory import table_memory
from ssl_rec.hardware.precision import Precision
from ssl_rec.hardware.quantization import dequantize_rows, quantize_rows
from ssl_rec.hardware.spec import TableSpec
from ssl_rec.hardware.table_allocation import allocating

INIT_CHUNK_ROWS = 1 << 16
MAX_DIM = 2048  # the compiled kernels' per-row scratch size

__all__ = ["EmbeddingTable", "RowShard"]


class RowShard(NamedTuple):
    """Which rows of a logical table a table holds: global row = ``offset + local * stride``.

    Attributes:
        offset: Global index of local row 0.
        stride: Global distance between consecutive local rows (row-wise shards are cyclic:
            row ``g`` of a table split over ``n`` shards lives on shard ``g % n``).
        cache_sets: Cache sets of this shard (``None``: from its own rows and spec); a
            cyclic shard of a table with ``S`` sets holds ``S / n`` of them.

    """

    offset: int = 0
    stride: int = 1
    cache_sets: int | None = None


def _open_store(shape: tuple[int, int], dtype: torch.dtype, path: str | None) -> torch.Tensor:
    if path is None:
        return huge_pages.empty(shape, dtype)
    numel = shape[0] * shape[1]
    # shared=True maps the file MAP_SHARED: pages are read on demand and written back by the
    # OS, so only the cache and the touched pages need RAM.
    return torch.from_file(path, shared=True, size=numel, dtype=dtype).view(shape)


def _store_in_dir(shape: tuple[int, int], dtype: torch.dtype, directory: str,
                  stream: int) -> torch.Tensor:  # fmt: skip
    """A store mapped from a new file in ``directory``, unlinked at once.

    The mapping keeps the file alive; its disk space returns when the process ends, so a
    killed run leaves nothing behind.
    """
    if not os.path.isdir(directory):
        raise ValueError(f"TableSpec.store_dir {directory!r} is not an existing directory")
    fd, path = tempfile.mkstemp(prefix=f".table{stream}-", suffix=".store", dir=directory)
    os.close(fd)
    try:
        return _open_store(shape, dtype, path)
    finally:
        os.unlink(path)


class EmbeddingTable(TracksReplacement):
    """One table: low-precision store, optional FP32 cache, row-wise optimizer state.

    Args:
        num_rows: Rows R (local to this shard); ``R * k`` for a logical ``[R, D]`` table with
            ``k = spec.column_blocks`` (see :mod:`~ssl_rec.hardware.column_blocks`).
        dim: Width of the stored rows: the embedding dimension D, ``D / k`` with blocks.
        spec: Storage, cache and optimizer choice.
        stream: RNG stream id (the global table index).
        store_path: Memory-map the store to this file (created or overwritten) instead of RAM
            (default: a file in ``spec.store_dir`` if set).
        shard: The global rows this table holds (default: all rows of the logical table).
        name: The table's name in messages (default ``stream {stream}``).
        meta: Declare the buffers on the meta device: shapes only, no memory, no store file
            (see :mod:`~ssl_rec.hardware.table_allocation`).

    Attributes:
        store: uint8[R, row_bytes] fused rows or float[R, D].
        momentum: float32[R] row-wise Adagrad state, float32[0] for SGD.
        cache: The :class:`RowCache`.

    Example:
        >>> t = EmbeddingTable(100, 8, TableSpec("int4"), stream=0)
        >>> t.init_normal(std=0.05, seed=0)
        >>> t.store.shape
        torch.Size([100, 8])

    """

    def __init__(
        self,
        num_rows: int,
        dim: int,
        spec: TableSpec,
        stream: int,
        store_path: str | None = None,
        shard: RowShard = RowShard(),  # noqa: B008 - immutable
        name: str | None = None,
        meta: bool = False,
    ) -> None:
        super().__init__()
        if num_rows <= 0 or not 0 < dim <= MAX_DIM:
            raise ValueError(f"num_rows={num_rows} must be > 0 and dim={dim} in [1, {MAX_DIM}]")
        spec.precision.check_dim(dim)
        self.num_rows, self.dim, self.spec = num_rows, dim, spec
        if shard.offset < 0 or shard.stride < 1:
            raise ValueError(f"shard {shard} needs offset >= 0 and stride >= 1")
        if spec.column_blocks > 1 and (spec.column_blocks % shard.stride or num_rows % (
                spec.column_blocks // shard.stride)):  # fmt: skip
            raise ValueError(
                f"table {name or stream!r}: a table with column_blocks={spec.column_blocks} "
                f"holds whole blocks of its rows (got {num_rows} rows, shard {shard})"
            )
        self.stream, self.shard = stream, shard
        self.name = f"stream {stream}" if name is None else name
        self.row_offset, self.row_stride = shard.offset, shard.stride
        shape = spec.precision.store_shape(num_rows, dim)
        dtype = spec.precision.dtype
        mom_rows = num_rows if spec.optimizer == "rowwise_adagrad" else 0
        if meta:
            self.register_buffer("store", torch.empty(shape, dtype=dtype, device="meta"))
            self.register_buffer("momentum", torch.empty((mom_rows,), device="meta"))
            self.cache = RowCache(num_rows, dim, spec, sets=shard.cache_sets, meta=True)
            return
        where = f"store ({num_rows} rows x {dim}, {spec.precision})"
        with allocating(self.name, where, shape[0] * shape[1] * dtype.itemsize):
            if store_path is None and spec.store_dir is not None:
                store = _store_in_dir(shape, dtype, spec.store_dir, stream)
            else:
                store = _open_store(shape, dtype, store_path)
        self.register_buffer("store", store)
        with allocating(self.name, f"optimizer state ({mom_rows} rows)", mom_rows * 4):
            self.register_buffer("momentum", huge_pages.zeros((mom_rows,)))
        sets = shard.cache_sets
        with allocating(self.name, "cache", table_memory(num_rows, dim, spec, sets)["cache_rows"]):
            self.cache = RowCache(num_rows, dim, spec, sets=sets)

    @property
    def rows_per_id(self) -> int:
        """Rows a lookup reads per id: the column blocks this table holds of a logical row.

        ``k`` for a whole table with ``k`` column blocks, ``k / n`` for a column-wise shard
        of ``n`` (its local rows ``id * k / n + i``), 1 for an unblocked table or row shard.
        """
        k = self.spec.column_blocks
        return k // self.row_stride if k > 1 else 1

    @property
    def declared(self) -> bool:
        """Whether the buffers are only declared (meta device, no memory)."""
        return self.store.is_meta

    @torch.no_grad()
    def init_normal(self, std: float, seed: int, logical_rows: int | None = None) -> None:
        """Fill the store with N(0, std^2) rows, rounded to nearest, chunk by chunk.

        The values are those of the logical table's rows, whatever rows this table holds:
        a shard draws the logical table's random stream (``INIT_CHUNK_ROWS`` rows at a time)
        up to its last row and keeps its own rows, so its initial rows do not depend on how
        the table is split, and memory stays one chunk above the shard's.

        Args:
            std: Standard deviation.
            seed: The collection's seed (the stream is keyed by ``seed`` and ``stream``).
            logical_rows: Rows of the logical table (default: this table's, for a whole table).

        """
        total = self.num_rows if logical_rows is None else logical_rows
        offset, stride = self.row_offset, self.row_stride
        last = offset + (self.num_rows - 1) * stride
        if last >= total:
            raise ValueError(f"table {self.name!r}: shard rows reach {last}, table has {total}")
        gen = torch.Generator().manual_seed(seed * 1_000_003 + self.stream)
        # A blocked table draws whole logical rows (k blocks each), in the chunks of an
        # unblocked table: its initial values are the unblocked table's, cut into blocks.
        k = self.spec.column_blocks
        chunk = INIT_CHUNK_ROWS * k
        # One chunk buffer for all chunks: a fresh one per chunk would leave the allocator's
        # heap grown by several chunks, which a tight memory limit then refuses to a store.
        buffer = torch.empty(min(chunk, total) // k, self.dim * k)
        fp32 = self.spec.precision is Precision.fp32  # (quantize_rows would copy FP32 rows)
        for start in range(0, last + 1, chunk):
            n = min(chunk, total - start)
            rows = torch.randn(n // k, self.dim * k, generator=gen, out=buffer[: n // k])
            rows = rows.mul_(std).view(n, self.dim)
            first = max(0, -(-(start - offset) // stride))  # first local row in this chunk
            # (a view of the chunk for a whole table: contiguous() then copies nothing)
            rows = rows[offset + first * stride - start :: stride][: self.num_rows - first]
            if len(rows):
                rows = rows.contiguous()
                values = rows if fp32 else quantize_rows(rows, self.spec.precision)
                self.store[first : first + len(rows)] = values

    @torch.no_grad()
    def load_float(self, weight: torch.Tensor) -> None:
        """Quantize float32[R, D] weights (to nearest) into the store; empties the cache.

        A whole table with column blocks also takes its logical ``[R / k, D * k]`` rows.
        """
        per = self.rows_per_id
        if per > 1 and tuple(weight.shape) == (self.num_rows // per, self.dim * per):
            weight = weight.reshape(self.num_rows, self.dim)
        if tuple(weight.shape) != (self.num_rows, self.dim):
            raise ValueError(f"weight shape {tuple(weight.shape)} != ({self.num_rows}, {self.dim})")
        for start in range(0, self.num_rows, INIT_CHUNK_ROWS):
            chunk = weight[start : start + INIT_CHUNK_ROWS].float()
            self.store[start : start + len(chunk)] = quantize_rows(chunk, self.spec.precision)
        self.cache.tags.fill_(-1)

    def meta_row(self) -> list[int]:
        """This table's row of the kernels' ``int64[T, 10]`` metadata (``layout.META_*``)."""
        return [
            self.spec.precision.code,
            POLICY_CODES[self.spec.cache_policy],
            OPTIMIZER_CODES[self.spec.optimizer],
            int(self.spec.stochastic_rounding),
            self.stream,
            self.row_offset,
            self.num_rows,
            self.dim,
            self.row_stride,
            # no batch reaches MAX_ADMISSION samples of a row: larger counts act alike
            min(self.spec.admission_count, MAX_ADMISSION),
        ]

    def store_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """float32[n, D] values of ``rows`` in the store (ignoring the cache)."""
        return dequantize_rows(self.store[rows], self.spec.precision, self.dim)

    def memory(self) -> dict[str, int]:
        """Byte report of this table (see ``memory.table_memory``)."""
        return table_memory(self.num_rows, self.dim, self.spec, sets=self.cache.sets)

    def cache_stats(self) -> dict[str, float]:
        """Cache statistics of this table (see ``RowCache.cache_stats``)."""
        return self.cache.cache_stats(self.spec.precision.row_bytes(self.dim))
