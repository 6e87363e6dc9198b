"""Preprocessed splits on disk: HuggingFace ``datasets`` Arrow files in a keyed cache.

Each split is one Arrow stream file (``<split>.arrow``) with one fixed-size-list column per
feature group (``dense float32[n_dense]``, ``sparse int32[F]``), ``label float32`` when
labeled and ``prob float32`` (true click probability) for synthetic data. A cache entry is
a directory ``<cache_dir>/<kind>-<key>`` whose key hashes the inputs and options; it is
built in a temporary sibling and renamed when complete (:func:`ssl_rec._io.atomic_directory`),
so an interrupted build never leaves an entry that a later run trusts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa

from ssl_rec._io import atomic_directory
from ssl_rec.schema import SCHEMA_FILENAME, FeatureSchema

DENSE, SPARSE, LABEL, PROB = "dense", "sparse", "label", "prob"
SPLITS = ("train", "val", "test")
# File stems that name a split in a directory of files (train.csv, valid.txt.gz, ...).
SPLIT_NAMES = {"train": "train", "valid": "val", "val": "val", "validation": "val", "test": "test"}
CACHE_ENV = "SSL_REC_CACHE"
FORMAT_VERSION = 1
log = logging.getLogger(__name__)


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
    """Arrow schema of a split file."""
    fields = [
        pa.field(DENSE, pa.list_(pa.float32(), n_dense)),
        pa.field(SPARSE, pa.list_(pa.int32(), n_fields)),
    ]
    if labeled:
        fields.append(pa.field(LABEL, pa.float32()))
    if with_prob:
        fields.append(pa.field(PROB, pa.float32()))
    return pa.schema(fields)


class SplitWriter:
    """Append batches of rows to ``<directory>/<split>.arrow`` (Arrow stream format).

    Args:
        path: the ``.arrow`` file to create.
        schema: from :func:`split_schema`.

    Example:
        >>> with SplitWriter(path, split_schema(13, 26, True, False)) as w:  # doctest: +SKIP
        ...     w.write(dense, sparse, label)

    """

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.schema = schema
        self.rows = 0
        self._sink = pa.OSFile(str(path), "wb")
        self._writer = pa.ipc.new_stream(self._sink, schema)

    def write(
        self,
        dense: np.ndarray,
        sparse: np.ndarray,
        label: np.ndarray | None = None,
        prob: np.ndarray | None = None,
    ) -> None:
        """Append ``N`` rows: ``dense float32[N, n_dense]``, ``sparse int32[N, F]``, ``[N]``."""
        n = sparse.shape[0]
        cols = [
            pa.FixedSizeListArray.from_arrays(
                pa.array(np.ascontiguousarray(dense, np.float32).reshape(-1)), dense.shape[1]
            ),
            pa.FixedSizeListArray.from_arrays(
                pa.array(np.ascontiguousarray(sparse, np.int32).reshape(-1)), sparse.shape[1]
            ),
        ]
        for name, values in ((LABEL, label), (PROB, prob)):
            if self.schema.get_field_index(name) >= 0:
                cols.append(pa.array(np.asarray(values, np.float32)))
        self._writer.write_batch(pa.RecordBatch.from_arrays(cols, schema=self.schema))
        self.rows += n

    def close(self) -> None:
        """Finish the stream and close the file."""
        self._writer.close()
        self._sink.close()

    def __enter__(self) -> SplitWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_split(directory: str | os.PathLike[str], split: str) -> datasets.Dataset:
    """Memory-map ``<directory>/<split>.arrow`` as a ``datasets.Dataset``."""
    path = Path(directory) / f"{split}.arrow"
    if not path.is_file():
        raise FileNotFoundError(f"no preprocessed split {split!r} at {path}")
    return datasets.Dataset.from_file(str(path), in_memory=False)


def cached_build(
    cache_dir: str | os.PathLike[str],
    kind: str,
    inputs: dict[str, Any],
    build: Callable[[Path, Path], FeatureSchema],
) -> tuple[Path, FeatureSchema]:
    """Return the cache entry for ``inputs``, building it first if absent.

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
        return final, FeatureSchema.load(final)
    try:
        with atomic_directory(final, overwrite=True) as tmp:
            schema = build(tmp, final)
            schema.save(tmp)
    except OSError:
        # Another process finished the same entry first: theirs is complete, use it.
        if not (final / SCHEMA_FILENAME).is_file():
            raise
    log.info("preprocessed data cached at %s", final)
    return final, FeatureSchema.load(final)
