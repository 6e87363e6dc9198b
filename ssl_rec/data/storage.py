"""Preprocessed splits on disk: sharded Arrow files in a keyed, locked cache.

Each split is a directory of Arrow stream files (``<split>/00000.arrow``, ...): a new shard
starts with every input file and after ``shard_rows`` rows, so no file grows without bound
and a split larger than RAM is read by memory-mapping one shard at a time. Columns: one
fixed-size list per feature group (``dense float32[n_dense]``, ``sparse int32[F]``),
``label float32`` when labeled and ``prob float32`` (true click probability) for synthetic
data. A cache entry is a directory ``<cache_dir>/<kind>-<key>`` whose key hashes the inputs
and options; it is built in a temporary sibling under a lock and renamed when complete
(:mod:`ssl_rec._io`), so an interrupted build never leaves an entry a later run trusts.
``checksums.json`` records every file's CRC-32; shards are checked when a process first
opens them, so bytes changed on disk are reported instead of trained on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import datasets
import filelock
import numpy as np
import pyarrow as pa

from ssl_rec._io import (
    atomic_directory,
    atomic_write_json,
    directory_checksums,
    remove_stale_temporaries,
    verify_file,
)
from ssl_rec.data.split_plan import SPLIT_NAMES, SPLITS
from ssl_rec.schema import SCHEMA_FILENAME, FeatureSchema

DENSE, SPARSE, LABEL, PROB = "dense", "sparse", "label", "prob"
SHARD_ROWS = 2_000_000
CACHE_ENV = "SSL_REC_CACHE"
CHECKSUMS_FILENAME = "checksums.json"
# 3: one vocabulary.arrow per entry, no vocab/<field>.arrow (older entries are rebuilt).
# 4: the schema's metadata holds the dense columns' training statistics.
FORMAT_VERSION = 4
log = logging.getLogger(__name__)

__all__ = ["SPLITS", "SPLIT_NAMES", "ShardWriter", "cached_build", "open_split", "split_schema"]


def default_cache_dir() -> Path:
    """``$SSL_REC_CACHE`` if set, else ``~/.cache/ssl_rec``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "ssl_rec")


def file_fingerprint(paths: Sequence[str | os.PathLike[str]]) -> list[dict[str, Any]]:
    """Describe each file by resolved path, size and mtime (changes when it is replaced)."""
    out = []
    for p in paths:
        st = Path(p).stat()
        out.append({"path": str(Path(p).resolve()), "size": st.st_size, "mtime": st.st_mtime_ns})
    return out


def cache_key(inputs: dict[str, Any]) -> str:
    """16 hex digits of the SHA-256 of ``inputs`` as canonical JSON (plus format version)."""
    doc = json.dumps({"format": FORMAT_VERSION, **inputs}, sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def split_schema(n_dense: int, n_fields: int, labeled: bool, with_prob: bool) -> pa.Schema:
    """Arrow schema of a split's shards."""
    fields = [
        pa.field(DENSE, pa.list_(pa.float32(), n_dense)),
        pa.field(SPARSE, pa.list_(pa.int32(), n_fields)),
    ]
    if labeled:
        fields.append(pa.field(LABEL, pa.float32()))
    if with_prob:
        fields.append(pa.field(PROB, pa.float32()))
    return pa.schema(fields)


def record_batch(schema: pa.Schema, dense: np.ndarray, sparse: np.ndarray,
                 label: np.ndarray | None = None, prob: np.ndarray | None = None
                 ) -> pa.RecordBatch:  # fmt: skip
    """Rows ``dense float32[N, n_dense]``, ``sparse int32[N, F]`` (+ ``[N]``) as one batch."""
    cols = [
        pa.FixedSizeListArray.from_arrays(
            pa.array(np.ascontiguousarray(values, dtype).reshape(-1)),
            schema.field(name).type.list_size,
        )
        for name, values, dtype in ((DENSE, dense, np.float32), (SPARSE, sparse, np.int32))
    ]
    for name, values in ((LABEL, label), (PROB, prob)):
        if schema.get_field_index(name) >= 0:
            cols.append(pa.array(np.asarray(values, np.float32)))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


class ShardWriter:
    """Append rows to a split directory, one Arrow stream file per shard.

    Args:
        directory: ``<entry>/<split>`` (created).
        schema: from :func:`split_schema`.
        shard_rows: rows per shard at most.

    Example:
        >>> schema = split_schema(13, 26, True, False)
        >>> dense, sparse, label = np.zeros((4, 13)), np.ones((4, 26)), np.zeros(4)
        >>> with ShardWriter(Path("entry") / "train", schema) as w:
        ...     w.write(record_batch(schema, dense, sparse, label))

    """

    def __init__(self, directory: Path, schema: pa.Schema, shard_rows: int = SHARD_ROWS) -> None:
        if shard_rows < 1:
            raise ValueError(f"shard_rows must be >= 1, got {shard_rows}")
        self.directory, self.schema, self.shard_rows = Path(directory), schema, shard_rows
        self.directory.mkdir(parents=True, exist_ok=True)
        self.rows = 0
        self.shards: list[tuple[Path, int]] = []
        self._sink: pa.NativeFile | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None

    def _next_path(self) -> Path:
        return self.directory / f"{len(self.shards):05d}.arrow"

    def write(self, batch: pa.RecordBatch) -> None:
        """Append a batch, starting new shards as they fill."""
        while batch.num_rows:
            if self._writer is None:
                path = self._next_path()
                self._sink = pa.OSFile(str(path), "wb")
                self._writer = pa.ipc.new_stream(self._sink, self.schema)
                self.shards.append((path, 0))
            path, held = self.shards[-1]
            take = min(batch.num_rows, self.shard_rows - held)
            self._writer.write_batch(batch.slice(0, take))
            self.shards[-1] = (path, held + take)
            self.rows += take
            batch = batch.slice(take)
            if held + take >= self.shard_rows:
                self.end_part()

    def end_part(self) -> None:
        """Close the current shard; the next row starts a new one (one input file per shard)."""
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
            self._writer = self._sink = None

    def adopt(self, path: Path, rows: int) -> None:
        """Move a finished shard file of this schema in as the next shard."""
        self.end_part()
        target = self._next_path()
        os.replace(path, target)
        self.shards.append((target, rows))
        self.rows += rows

    def close(self) -> None:
        """Finish the last shard (an empty split gets one empty shard)."""
        if not self.shards:
            path = self._next_path()
            with pa.OSFile(str(path), "wb") as sink:
                pa.ipc.new_stream(sink, self.schema).close()
            self.shards.append((path, 0))
        self.end_part()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shard_paths(directory: str | os.PathLike[str], split: str) -> list[Path]:
    """The shard files of ``split`` in order (``FileNotFoundError`` if there are none)."""
    folder = Path(directory) / split
    paths = sorted(folder.glob("*.arrow")) if folder.is_dir() else []
    if not paths:
        raise FileNotFoundError(f"no preprocessed split {split!r} at {folder}")
    return paths


def write_entry_checksums(entry: Path) -> None:
    """Record the checksum of every file of a cache entry in ``<entry>/checksums.json``."""
    files = directory_checksums(entry, exclude=[CHECKSUMS_FILENAME])
    atomic_write_json(entry / CHECKSUMS_FILENAME, {"format": 1, "files": files})


def verify_entry_files(entry: str | os.PathLike[str], paths: Sequence[Path]) -> None:
    """Check files of a cache entry against its ``checksums.json`` (once per process each).

    An entry written before checksums (no ``checksums.json``) is not checked; in one that
    has them, a file missing from the record is as corrupt as a changed one.

    Raises:
        ChecksumError: a ``ValueError`` naming the file and how to rebuild the entry.

    """
    entry = Path(entry)
    record = entry / CHECKSUMS_FILENAME
    if not record.is_file():
        return
    try:
        files = json.loads(record.read_text())["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{record}: corrupt ({e}); delete {entry} to rebuild it") from e
    remedy = f"delete {entry} to rebuild it"
    for path in paths:
        rel = Path(path).relative_to(entry).as_posix()
        if rel not in files:
            raise ValueError(f"{path}: not a file this cache entry was written with; {remedy}")
        verify_file(path, files[rel], remedy)


def open_split(directory: str | os.PathLike[str], split: str) -> datasets.Dataset:
    """Memory-map the shards of ``<directory>/<split>/`` as one ``datasets.Dataset``.

    Each shard is checked against the entry's recorded checksums once per process
    (:func:`verify_entry_files`; ``SSL_REC_VERIFY=0`` skips it).
    """
    paths = shard_paths(directory, split)
    parts = [_open_shard(p, Path(directory)) for p in paths]
    verify_entry_files(directory, paths)
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def _open_shard(path: Path, entry: Path) -> datasets.Dataset:
    """Memory-map one shard; a truncated or unreadable file is named with the way to rebuild."""
    try:
        return datasets.Dataset.from_file(str(path), in_memory=False)
    except (OSError, pa.ArrowException) as e:
        reason = " ".join(str(e).split())[:160] or type(e).__name__
        raise ValueError(
            f"{path}: unreadable preprocessed shard ({reason}); delete {entry} to rebuild it"
        ) from e


@contextlib.contextmanager
def entry_build_lock(path: str | os.PathLike[str], message: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (a :class:`filelock.FileLock`) inside the block.

    The operating system releases it when the holder dies, so a killed build never blocks
    the next one; the lock file is left in place.

    Args:
        path: lock file (created, with its directory, if missing).
        message: logged once (``waiting for <path>: <message>``) when another process holds
            the lock and this one waits for it.

    """
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(path)
    try:
        lock.acquire(blocking=False)
    except filelock.Timeout:
        log.info("waiting for %s: %s", path, message)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def cached_build(
    cache_dir: str | os.PathLike[str],
    kind: str,
    inputs: dict[str, Any],
    build: Callable[[Path, Path], FeatureSchema],
) -> tuple[Path, FeatureSchema]:
    """Return the cache entry for ``inputs``, building it first if absent.

    A lock file ``.<entry>.lock`` makes a second process wait for the first one's build
    and then use it; temporary directories of killed builds are removed first.

    Args:
        cache_dir: root of the cache.
        kind: entry prefix (``"criteo"``, ``"synthetic"``, ``"tabular"``).
        inputs: everything the result depends on (file fingerprints, options), JSON-able.
        build: ``build(tmp_dir, final_dir) -> schema`` writes the splits into ``tmp_dir``;
            paths stored in the schema must use ``final_dir``.

    Returns:
        ``(entry_dir, schema)``.

    """
    final = Path(cache_dir) / f"{kind}-{cache_key(inputs)}"
    if (final / SCHEMA_FILENAME).is_file():
        log.info("using preprocessed data cached at %s", final)
        verify_entry_files(final, [final / SCHEMA_FILENAME])
        return final, FeatureSchema.load(final)
    lock = final.with_name(f".{final.name}.lock")
    with entry_build_lock(lock, f"another process is building {final}; waiting for it"):
        if not (final / SCHEMA_FILENAME).is_file():
            remove_stale_temporaries(final)
            log.info("preprocessing into %s", final)
            with atomic_directory(final, overwrite=True) as tmp:
                schema = build(tmp, final)
                schema.save(tmp)
                write_entry_checksums(tmp)
    log.info("preprocessed data cached at %s", final)
    return final, FeatureSchema.load(final)
