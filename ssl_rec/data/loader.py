"""Iterable batch loader over a memory-mapped, sharded Arrow split: no per-row Python.

Rows are read in contiguous blocks (zero-copy views of the memory-mapped columns, one
copy into memory per block); with shuffling, blocks come in a random order and rows are
permuted within each block, so a batch is one contiguous slice of the permuted block (or
the tail of one block and the head of the next).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import torch

from ssl_rec.data.storage import DENSE, LABEL, SPARSE
from ssl_rec.types import Batch


def fixed_list_to_numpy(column: pa.ChunkedArray) -> np.ndarray:
    """``[N, width]`` numpy array of a fixed-size-list column (zero-copy for one chunk)."""
    width = column.type.list_size
    chunks = [c.flatten().to_numpy(zero_copy_only=False) for c in column.chunks]
    flat = chunks[0] if len(chunks) == 1 else np.concatenate(chunks) if chunks else np.zeros(0)
    return flat.reshape(-1, width)


def validate_sparse(sparse: np.ndarray, cardinalities: list[int], where: str = "") -> None:
    """Raise ``ValueError`` if any id of ``sparse int[N, F]`` is outside ``0..cardinality-1``.

    Args:
        sparse: pre-encoded ids.
        cardinalities: ``F`` cardinalities.
        where: prefix for the message (file or split name).

    """
    card = np.asarray(cardinalities)
    bad = (sparse < 0) | (sparse >= card[None, :])
    if bad.any():
        row, f = (int(i[0]) for i in np.nonzero(bad))
        raise ValueError(
            f"{where}row {row}, field {f}: id {int(sparse[row, f])} outside the allowed "
            f"range 0..{int(card[f]) - 1}"
        )


class BatchLoader:
    """Yields :class:`ssl_rec.types.Batch` from an Arrow table of one split (may be sharded).

    Each epoch cuts the split into blocks of ``block_rows`` rows, orders them (randomly when
    shuffling; the short last block stays last) and reads them as contiguous slices (one
    copy out of the memory map per block), permuting the rows within each block. A table of
    many memory-mapped shards is one sequence of rows, so blocks shuffle within and across
    shards. With ``world_size`` ranks the epoch's block sequence is cut into equal
    contiguous portions of ``N // world_size`` rows: ranks read disjoint rows, the same
    number of batches, and at most ``world_size - 1`` rows of the epoch are left out.

    Args:
        table: columns ``dense`` (``float32[n_dense]`` lists), ``sparse`` (``int32[F]``
            lists) and optionally ``label``; may be memory-mapped.
        batch_size: rows per batch ``B``.
        shuffle: random block order and a permutation within each block, new each epoch.
        seed: base seed; epoch ``e`` shuffles with ``(seed, e)`` (the same on every rank).
        drop_last: drop the final incomplete batch.
        with_labels: yield ``label``; ``False`` yields ``label=None`` (pretraining).
        row_ids: ``int64[N]`` row id of each table row (default ``0..N-1``).
        block_rows: rows per shuffle block.
        rank: this process's rank ``0..world_size-1``.
        world_size: number of ranks.

    Example:
        >>> loader = BatchLoader(table, batch_size=4096, shuffle=True)  # doctest: +SKIP
        >>> next(iter(loader)).sparse.shape
        torch.Size([4096, 26])

    """

    def __init__(
        self,
        table: pa.Table,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        with_labels: bool = True,
        row_ids: np.ndarray | None = None,
        block_rows: int = 1 << 18,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if block_rows < 1:
            raise ValueError(f"block_rows must be >= 1, got {block_rows}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size - 1}], got {rank}")
        if with_labels and LABEL not in table.column_names:
            raise ValueError(f"with_labels=True but the table has no {LABEL!r} column")
        self.table, self.rank, self.world_size = table, rank, world_size
        self.num_rows = table.num_rows // world_size
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.drop_last, self.with_labels = drop_last, with_labels
        self.row_ids = row_ids
        self.block_rows = block_rows
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use the shuffle of ``epoch`` for the next iteration."""
        self.epoch = epoch

    def __len__(self) -> int:
        """Batches per epoch (the same on every rank)."""
        full, rest = divmod(self.num_rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _pieces(self, rng: np.random.Generator | None) -> Iterator[tuple[int, int]]:
        """This rank's ``(start, stop)`` row ranges of the epoch, in reading order."""
        n = self.table.num_rows
        starts = np.arange(0, n, self.block_rows)
        if rng is not None:
            full = starts[starts + self.block_rows <= n]
            starts = np.concatenate([rng.permutation(full), starts[len(full) :]])
        lo = self.rank * self.num_rows
        hi, offset = lo + self.num_rows, 0
        for s in starts.tolist():
            length = min(self.block_rows, n - s)
            a, b = max(lo, offset), min(hi, offset + length)
            if a < b:
                yield s + a - offset, s + b - offset
            offset += length
            if offset >= hi:
                return

    def _read(
        self, start: int, stop: int, rng: np.random.Generator | None
    ) -> dict[str, np.ndarray]:
        part = self.table.slice(start, stop - start)
        block = {
            "dense": fixed_list_to_numpy(part.column(DENSE)),
            "sparse": fixed_list_to_numpy(part.column(SPARSE)),
        }
        if self.with_labels:
            block["label"] = part.column(LABEL).to_numpy()
        ids = np.arange(start, stop, dtype=np.int64)
        block["row_id"] = ids if self.row_ids is None else self.row_ids[ids]
        if rng is None:
            # Copy out of the read-only memory map; torch tensors must own writable memory.
            return {k: np.array(v) for k, v in block.items()}
        perm = rng.permutation(stop - start)
        return {k: v[perm] for k, v in block.items()}

    def __iter__(self) -> Iterator[Batch]:
        """One epoch of batches; each iteration advances the epoch counter."""
        rng = np.random.default_rng([self.seed, self.epoch]) if self.shuffle else None
        self.epoch += 1
        size, carry = self.batch_size, None
        for start, stop in self._pieces(rng):
            block, first = self._read(start, stop, rng), 0
            if carry is not None:
                # A batch straddling two blocks: the tail of one plus the head of the next.
                first = size - len(carry["row_id"])
                carry = {k: np.concatenate([carry[k], v[:first]]) for k, v in block.items()}
                if len(carry["row_id"]) < size:
                    continue
                yield self._to_batch(carry)
                carry = None
            n = len(block["row_id"])
            full = first + (n - first) // size * size
            for s in range(first, full, size):
                yield self._to_batch({k: v[s : s + size] for k, v in block.items()})
            carry = {k: v[full:] for k, v in block.items()} if full < n else None
        if carry is not None and not self.drop_last:
            yield self._to_batch(carry)

    @staticmethod
    def _to_batch(piece: dict[str, np.ndarray]) -> Batch:
        label = piece.get("label")
        return Batch(
            dense=torch.from_numpy(np.ascontiguousarray(piece["dense"], np.float32)),
            sparse=torch.from_numpy(piece["sparse"].astype(np.int64)),
            label=None if label is None else torch.from_numpy(np.ascontiguousarray(label)),
            row_id=torch.from_numpy(np.ascontiguousarray(piece["row_id"])),
        )
