"""Iterable batch loader over a memory-mapped Arrow split: whole-batch slicing, no per-row Python.

Rows are read in contiguous blocks (zero-copy views of the memory-mapped columns, one
copy into memory per block); with shuffling, blocks come in a random order and rows are
permuted within each block, so a batch is one contiguous slice of the permuted block.

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
    """Yields :class:`ssl_rec.types.Batch` from an Arrow table of one split.

    Args:
        table: columns ``dense`` (``float32[n_dense]`` lists), ``sparse`` (``int32[F]``
            lists) and optionally ``label``; may be memory-mapped.
        batch_size: rows per batch ``B``.
        shuffle: random block order and a permutation within each block, new each epoch.
        seed: base seed; epoch ``e`` shuffles with ``(seed, e)``.
        drop_last: drop the final incomplete batch.
        with_labels: yield ``label``; ``False`` yields ``label=None`` (pretraining).
        row_ids: ``int64[N]`` row id of each table row (default ``0..N-1``).
        block_rows: rows per shuffle block (rounded up to whole batches).
        rank: this process's shard ``0..world_size-1``; each gets ``N // world_size``
            contiguous rows so every rank yields the same number of batches.
        world_size: number of shards.

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
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size - 1}], got {rank}")
        if with_labels and LABEL not in table.column_names:
            raise ValueError(f"with_labels=True but the table has no {LABEL!r} column")
        n = table.num_rows
        per_rank = n // world_size if world_size > 1 else n
        self._start = rank * per_rank
        self.num_rows = per_rank
        self.table = table
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.drop_last, self.with_labels = drop_last, with_labels
        self.row_ids = row_ids
        self.block_rows = max(batch_size, -(-block_rows // batch_size) * batch_size)
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
        """Batches per epoch."""
        full, rest = divmod(self.num_rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _read_block(self, start: int, stop: int) -> dict[str, np.ndarray]:
        part = self.table.slice(self._start + start, stop - start)
        block = {
            "dense": fixed_list_to_numpy(part.column(DENSE)),
            "sparse": fixed_list_to_numpy(part.column(SPARSE)),
        }
        if self.with_labels:
            block["label"] = part.column(LABEL).to_numpy()
        ids = np.arange(self._start + start, self._start + stop, dtype=np.int64)
        block["row_id"] = ids if self.row_ids is None else self.row_ids[ids]
        return block

    def _blocks(
        self, rng: np.random.Generator | None, skip_blocks: int = 0
    ) -> Iterator[dict[str, np.ndarray]]:
        starts = np.arange(0, self.num_rows, self.block_rows)
        if rng is not None:
            # The short last block stays last, so only the final batch can be partial.
            full = starts[starts + self.block_rows <= self.num_rows]
            starts = np.concatenate([rng.permutation(full), starts[len(full) :]])
        for i, s in enumerate(starts):
            stop = min(int(s) + self.block_rows, self.num_rows)
            if i < skip_blocks:
                if rng is not None:
                    rng.permutation(stop - int(s))  # keep the random stream in step
                continue
            block = self._read_block(int(s), stop)
            if rng is None:
                # Copy out of the read-only memory map; torch tensors must own writable memory.
                yield {k: np.array(v) for k, v in block.items()}
                continue
            perm = rng.permutation(block["sparse"].shape[0])
            yield {k: v[perm] for k, v in block.items()}

    def __iter__(self) -> Iterator[Batch]:
        """One epoch of batches; each iteration advances the epoch counter."""
        epoch = self.sampler.epoch
        self.sampler.set_epoch(epoch + 1)
        skip = self._skip[1] if self._skip is not None and self._skip[0] == epoch else 0
        self._skip = None
        rng = np.random.default_rng([self.seed, epoch]) if self.shuffle else None
        per_block = self.block_rows // self.batch_size
        done = skip - skip % per_block
        self._position = (epoch, done)
        for block in self._blocks(rng, skip // per_block):
            n = block["sparse"].shape[0]
            for s in range(0, n, self.batch_size):
                if self.drop_last and s + self.batch_size > n:
                    break
                if done < skip:
                    done += 1
                    continue
                done += 1
                self._position = (epoch, done)
                yield self._to_batch({k: v[s : s + self.batch_size] for k, v in block.items()})

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
