"""Parsed training batches kept on disk between the two preprocessing passes.

The count pass parses each training file once and writes its validated batches (dense
values, labels, categorical columns dictionary-encoded per batch) to an Arrow stream in
the entry's temporary directory; the encode pass reads them back memory-mapped instead of
parsing the text again. The spill is about as large as the uncompressed text and is only
written while the disk has room for twice that (:func:`spill_fits`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from ssl_rec.data.raw import RawBatch
from ssl_rec.data.reading import is_gzip

GZIP_RATIO = 4  # uncompressed / compressed size of Criteo text
DENSE, LABEL = "dense", "label"


def spill_fits(paths: list[str], directory: Path) -> bool:
    """Whether spilling ``paths`` (estimated from their sizes) leaves half the disk free."""
    need = sum(Path(p).stat().st_size * (GZIP_RATIO if is_gzip(p) else 1) for p in paths)
    return need <= shutil.disk_usage(directory).free // 2


def _schema(n_dense: int, n_fields: int, labeled: bool) -> pa.Schema:
    fields = [pa.field(DENSE, pa.list_(pa.float32(), n_dense))]
    if labeled:
        fields.append(pa.field(LABEL, pa.float32()))
    fields += [pa.field(f"c{f}", pa.dictionary(pa.int32(), pa.string())) for f in range(n_fields)]
    return pa.schema(fields)


class SpillWriter:
    """Writes one file's validated batches.

    Args:
        path: the spill file.
        n_dense: dense columns.
        n_fields: categorical fields ``F``.
        labeled: whether batches carry labels.

    """

    def __init__(self, path: Path, n_dense: int, n_fields: int, labeled: bool) -> None:
        self.path, self.rows = path, 0
        self.schema = _schema(n_dense, n_fields, labeled)
        self._sink = pa.OSFile(str(path), "wb")
        self._writer = pa.ipc.new_stream(self._sink, self.schema)

    def write(self, raw: RawBatch, encoded: list[pa.DictionaryArray]) -> None:
        """Append a batch whose ``F`` categorical columns are already dictionary-encoded."""
        dense = pa.FixedSizeListArray.from_arrays(
            pa.array(raw.dense.reshape(-1)), self.schema.field(DENSE).type.list_size
        )
        label = [] if raw.label is None else [pa.array(raw.label)]
        self._writer.write_batch(
            pa.RecordBatch.from_arrays([dense, *label, *encoded], schema=self.schema)
        )
        self.rows += raw.num_rows

    def close(self) -> None:
        """Finish the stream."""
        self._writer.close()
        self._sink.close()


class SpillReader:
    """Reads a spill back as :class:`RawBatch` es (categorical columns dictionary arrays).

    Args:
        path: the spill file (deleted once read).
        source: the text file it was parsed from (named in progress and errors).
        source_bytes: that file's size, so :meth:`position` advances like a text read.
        rows: rows in the spill.

    """

    def __init__(self, path: Path, source: str, source_bytes: int, rows: int) -> None:
        self.spill, self.path, self.source_bytes = path, source, source_bytes
        self._rows, self._read = max(rows, 1), 0

    def position(self) -> int:
        """Bytes of the source file the batches read so far stand for."""
        return self.source_bytes * self._read // self._rows

    def __iter__(self) -> Iterator[RawBatch]:
        """Yield the spilled batches."""
        # Plain reads, not a memory map: mapped pages would stay in the resident set and
        # make peak memory grow with the file.
        with pa.OSFile(str(self.spill)) as source:
            reader = pa.ipc.open_stream(source)
            labeled = LABEL in reader.schema.names
            first = 2 if labeled else 1
            width = reader.schema.field(DENSE).type.list_size
            for batch in reader:
                dense = batch.column(DENSE).flatten().to_numpy().reshape(-1, width)
                label = batch.column(LABEL).to_numpy() if labeled else None
                self._read += batch.num_rows
                yield RawBatch(dense, list(batch.columns[first:]), label)
        os.unlink(self.spill)
