"""Iterable batch loader over a memory-mapped, sharded Arrow split: no per-row Python.

Rows are read in contiguous blocks (zero-copy views of the memory-mapped columns, one
copy into memory per block); with shuffling, blocks come in a random order and rows are
permuted within each block, so a batch is one contiguous slice of the permuted block (or
the tail of one block and the head of the next).

Resuming follows Lightning's conventions: the shuffle order is a ``sampler`` whose
``set_epoch`` Lightning calls at every epoch start, and ``state_dict`` / ``load_state_dict``
carry the position inside an epoch, so a run resumed from a mid-epoch checkpoint sees the
batches an uninterrupted run would have.
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
        >>> from ssl_rec.data.storage import record_batch, split_schema
        >>> schema = split_schema(13, 26, True, False)
        >>> rows = record_batch(schema, np.zeros((10, 13)), np.ones((10, 26)), np.zeros(10))
        >>> loader = BatchLoader(pa.Table.from_batches([rows]), batch_size=4, shuffle=True)
        >>> next(iter(loader)).sparse.shape
        torch.Size([4, 26])

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
        self.sampler = EpochShuffle(seed)
        self.batch_sampler = None  # Lightning reads it beside ``sampler``
        self._position = (0, 0)  # (epoch, batches yielded) of the current iteration
        self._skip: tuple[int, int] | None = None

    @property
    def epoch(self) -> int:
        """Epoch whose shuffle the next iteration uses."""
        return self.sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        """Use the shuffle of ``epoch`` for the next iteration."""
        self.sampler.set_epoch(epoch)

    def state_dict(self) -> dict[str, int]:
        """Epoch and batches yielded of the current iteration (Lightning saves it mid-epoch)."""
        epoch, batches = self._position
        return {"epoch": epoch, "batches": batches, "seed": self.seed,
                "rows": self.num_rows, "batch_size": self.batch_size}  # fmt: skip

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue epoch ``state["epoch"]`` after its first ``state["batches"]`` batches.

        Raises:
            ValueError: the state was saved by a loader over other rows, batch size or seed.

        """
        mine = {"seed": self.seed, "rows": self.num_rows, "batch_size": self.batch_size}
        theirs = {k: state.get(k) for k in mine}
        if theirs != mine:
            raise ValueError(
                f"the checkpoint's loader position is for {theirs}, this loader has {mine}; "
                "resume with the data, batch size and seed of the interrupted run"
            )
        self.sampler.set_epoch(int(state["epoch"]))
        self._skip = (int(state["epoch"]), int(state["batches"]))

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
        # ``np.take`` along rows copies whole rows; ``v[perm]`` on 2-D arrays is ~3x slower.
        return {k: np.take(v, perm, axis=0) for k, v in block.items()}

    def __iter__(self) -> Iterator[Batch]:
        """One epoch of batches; each iteration advances the epoch counter."""
        epoch = self.sampler.epoch
        self.sampler.set_epoch(epoch + 1)
        skip = self._skip[1] if self._skip is not None and self._skip[0] == epoch else 0
        self._skip = None
        self._position = (epoch, skip)
        rng = np.random.default_rng([self.seed, epoch]) if self.shuffle else None
        for batch in self._batches(rng, skip * self.batch_size):
            self._position = (epoch, self._position[1] + 1)
            yield batch

    def _blocks(
        self, rng: np.random.Generator | None, skip_rows: int
    ) -> Iterator[dict[str, np.ndarray]]:
        """This rank's blocks of the epoch, less their first ``skip_rows`` rows in all."""
        for start, stop in self._pieces(rng):
            if skip_rows >= stop - start:
                skip_rows -= stop - start
                if rng is not None:
                    rng.permutation(stop - start)  # keep the random stream in step
                continue
            block = self._read(start, stop, rng)
            if skip_rows:
                block, skip_rows = {k: v[skip_rows:] for k, v in block.items()}, 0
            yield block

    def _batches(self, rng: np.random.Generator | None, skip_rows: int) -> Iterator[Batch]:
        size, carry = self.batch_size, None
        for block in self._blocks(rng, skip_rows):
            first = 0
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


class EpochShuffle:
    """The shuffle order of a :class:`BatchLoader`: its seed and the epoch to shuffle for.

    Exposed as ``loader.sampler`` so Lightning's fit loop calls :meth:`set_epoch` at every
    epoch start (also after resuming), as it does for a ``DistributedSampler``.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Shuffle the next iteration with ``(seed, epoch)``."""
        self.epoch = int(epoch)
