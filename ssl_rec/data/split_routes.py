"""Where the encoded rows of each input part go: the shard writers of every split.

A ``random`` part's rows are drawn into splits row by row
(:class:`~ssl_rec.data.split_plan.SplitDraw`), a ``halves`` part is staged whole and then cut
(test first, val second), any other part goes to its split. Values unseen by given
vocabularies (and, of those, the ones rare in the vocabularies' training data) are counted per
split and field, row by row, so a drawn or cut part attributes each one to the split its row
went to.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from ssl_rec.data.raw import RawBatch
from ssl_rec.data.split_plan import SPLITS, Part, SplitDraw, SplitPlan, half_of
from ssl_rec.data.storage import ShardWriter, record_batch, split_schema

_UNPACK_ROWS = 1 << 20


class SplitRoutes:
    """The writers of every split, and where each part's rows go.

    Args:
        plan: the parts and the random draw.
        shape: ``(n_dense, F)``.
        shard_rows: rows per shard at most.
        out: the entry being written (splits go to ``out/<split>/``).
        count_unseen: count unseen values per split: ``unseen bool[N, 2F]`` given to
            :meth:`write` marks values not in the vocabulary (columns ``0..F-1``) and, of
            those, values rare in its training data (columns ``F..2F-1``); ``unseen[split]``
            holds the ``int64[2F]`` counts.

    """

    def __init__(self, plan: SplitPlan, shape: tuple[int, int], shard_rows: int, out: Path,
                 count_unseen: bool) -> None:  # fmt: skip
        self.writers = {
            s: ShardWriter(out / s, split_schema(*shape, plan.labeled(s), False), shard_rows)
            for s in SPLITS
        }
        self.draw, self.out, self.shard_rows = SplitDraw(plan), out, shard_rows
        width = 2 * shape[1]
        self.unseen = {s: np.zeros(width, np.int64) for s in SPLITS} if count_unseen else None
        self._staged_unseen: pa.NativeFile | None = None
        self._staged_path = out

    def staging(self, index: int) -> ShardWriter:
        """Where a ``halves`` part is written before it is cut."""
        schema = self.writers["test"].schema
        if self.unseen is not None:
            self._staged_path = self.out / f".halves-{index}.unseen"
            self._staged_unseen = pa.OSFile(str(self._staged_path), "wb")
        return ShardWriter(self.out / f".halves-{index}", schema, self.shard_rows)

    def write(self, part: Part, staged: ShardWriter | None, raw: RawBatch, ids: np.ndarray,
              unseen: np.ndarray | None) -> None:  # fmt: skip
        """Append a batch's rows (``ids int32[N, F]``; ``unseen bool[N, 2F]``) to their splits."""
        if part.mode == "random":
            codes = self.draw(raw.num_rows)
            for index, split in enumerate(SPLITS):
                rows = codes == index
                if rows.any():
                    self._append(self.writers[split], raw, ids, rows)
                    self._count(split, unseen, rows)
        elif staged is not None:
            self._append(staged, raw, ids, None)
            if self._staged_unseen is not None and unseen is not None:
                self._staged_unseen.write(np.packbits(unseen, axis=1).tobytes())
        else:
            self._append(self.writers[part.mode], raw, ids, None)
            self._count(part.mode, unseen, None)

    def _count(self, split: str, unseen: np.ndarray | None, rows: np.ndarray | None) -> None:
        if self.unseen is not None and unseen is not None:
            self.unseen[split] += np.count_nonzero(unseen if rows is None else unseen[rows], 0)

    @staticmethod
    def _append(
        writer: ShardWriter, raw: RawBatch, ids: np.ndarray, rows: np.ndarray | None
    ) -> None:
        pick = slice(None) if rows is None else rows
        label = None if raw.label is None else raw.label[pick]
        writer.write(record_batch(writer.schema, raw.dense[pick], ids[pick], label))

    def cut_in_halves(self, staged: ShardWriter) -> None:
        """Move a ``halves`` part's shards: first ``ceil(n/2)`` rows to test, the rest to val."""
        staged.close()
        half, start = half_of(staged.rows), 0
        test, val = self.writers["test"], self.writers["val"]
        for path, rows in staged.shards:
            if start + rows <= half:
                test.adopt(path, rows)
            elif start >= half:
                val.adopt(path, rows)
            else:
                _copy_cut(path, half - start, test, val)
            start += rows
        staged.directory.rmdir()
        if self._staged_unseen is not None:
            self._count_halves(self._staged_path, staged.rows, half)

    def _count_halves(self, path: Path, rows: int, half: int) -> None:
        """Unseen values of a cut part's two halves, from its packed per-row bits."""
        self._staged_unseen.close()
        self._staged_unseen = None
        fields = len(self.unseen["test"])
        if rows:
            bits = np.memmap(path, np.uint8, "r", shape=(rows, -(-fields // 8)))
            for s in range(0, rows, _UNPACK_ROWS):
                chunk = np.unpackbits(bits[s : s + _UNPACK_ROWS], axis=1, count=fields)
                cut = min(max(half - s, 0), len(chunk))
                self.unseen["test"] += chunk[:cut].sum(0, dtype=np.int64)
                self.unseen["val"] += chunk[cut:].sum(0, dtype=np.int64)
            del bits
        path.unlink()

    def end_part(self) -> None:
        """Start new shards: every input file begins its own."""
        for writer in self.writers.values():
            writer.end_part()

    def close(self) -> None:
        """Finish every split."""
        for writer in self.writers.values():
            writer.close()


def _copy_cut(path: Path, cut: int, first: ShardWriter, second: ShardWriter) -> None:
    """Rows ``[0, cut)`` of a shard to ``first``, the rest to ``second``, batch by batch."""
    with pa.OSFile(str(path)) as source:
        for batch in pa.ipc.open_stream(source):
            head = batch.slice(0, max(cut, 0))
            if head.num_rows:
                first.write(head)
            if head.num_rows < batch.num_rows:
                second.write(batch.slice(head.num_rows))
            cut -= batch.num_rows
    first.end_part()
    path.unlink()
