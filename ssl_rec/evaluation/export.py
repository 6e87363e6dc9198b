"""Export entity embeddings and split representations with FAISS indexes, atomically.

Layout of an export directory (every name is listed in ``manifest.json``)::

    manifest.json                 format version, schema, metric, precision, sets
    vocabulary.arrow              the model's vocabularies (raw value -> id per field)
    <set>.vectors.npy             float32|float16|uint8[n, d]
    <set>.quantizer.npy           float32[2 d] (int8 only)
    <set>.keys.npy                raw values (str[n], entity sets) or row ids (int64[n])
    <set>.ids.npy                 int64[n] vocabulary id of each entity (entity sets)
    <set>.labels.npy              float32[n] (representation sets with labels)
    <set>.faiss                   the FAISS index; FAISS id i = row i of the .npy files

``<set>`` is the set's name made a safe file name (:func:`~ssl_rec._paths.safe_file_name`:
``C1`` stays ``C1``, a field named ``../x`` becomes ``%2E.%2Fx~<hash>``), so no field name
writes outside the directory; readers find files through the manifest, never by name.

The manifest is written last and records the CRC-32 of every other file, which
:class:`~ssl_rec.evaluation.embedding_index.EmbeddingIndex` checks as it loads them.

Entity sets leave out the reserved id 0 (missing, rare and unseen values share it, so it
is no entity) and hash buckets no value fell into; the set's ``index.excluded_ids`` says
how many were left out.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ssl_rec._io import atomic_directory, atomic_write_json, directory_checksums
from ssl_rec._paths import safe_file_name
from ssl_rec.evaluation.faiss_index import (
    build_index_or_exact,
    check_metric,
    check_precision,
    default_search_params,
    resolve_factory,
    write_faiss_index,
)
from ssl_rec.evaluation.manifest import MANIFEST_FILENAME, Manifest, VectorSet, file_sha256
from ssl_rec.evaluation.representations import RepresentationSet, backbone_of
from ssl_rec.evaluation.vector_store import encode_vectors
from ssl_rec.schema import MISSING_ID, FeatureSchema
from ssl_rec.types import BackboneProtocol
from ssl_rec.vocab import UNUSED_VALUE, VOCABULARY_FILENAME, Vocabularies, schema_vocabularies

ROW_CHUNK = 65_536
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IndexConfig:
    """How exported vectors are stored and indexed.

    Args:
        index: FAISS factory string (``"Flat"``, ``"IVF1024,PQ16"``, ``"HNSW32"``, ...) or
            ``"auto"`` (exact below 20k vectors, else ``IVF{nlist},PQ{d/2}x4fs,RFlat``).
        metric: ``ip`` (inner product, higher is closer) or ``l2`` (squared distance).
        precision: ``fp32``, ``fp16`` or ``int8`` for the ``.npy`` vectors and the index's
            full-vector codes (``SQfp16``/``SQ8``).
        train_size: vectors sampled to train the index (``None``: all).
        normalize: L2-normalise vectors first (cosine similarity with ``ip``).
        seed: seed of the training sample.

    """

    index: str = "auto"
    metric: str = "ip"
    precision: str = "fp32"
    train_size: int | None = 100_000
    normalize: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        check_metric(self.metric)
        check_precision(self.precision)
        if self.train_size is not None and self.train_size <= 0:
            raise ValueError(
                f"IndexConfig.train_size must be positive or None, got {self.train_size}"
            )
        resolve_factory(self.index, 1, 2, self.precision)


def entity_vectors(
    model: nn.Module, field: str, cardinality: int, progress: bool = False
) -> np.ndarray:
    """Dequantized vector of every id ``0..cardinality-1`` of ``field``: ``float32[card, D]``."""
    backbone = backbone_of(model)
    chunks = []
    starts = range(0, cardinality, ROW_CHUNK)
    with torch.no_grad():
        # disable=None: a bar on a terminal only, never redrawn into a log file.
        shown = None if progress else True
        for start in tqdm(starts, desc=f"rows {field}", disable=shown, unit="chunk"):
            ids = torch.arange(start, min(start + ROW_CHUNK, cardinality), dtype=torch.int64)
            chunks.append(backbone.entity_vectors(field, ids).float().cpu().numpy())
    return np.concatenate(chunks)


def export_vocabularies(backbone: BackboneProtocol, schema: FeatureSchema) -> Vocabularies | None:
    """The vocabularies an export names raw values with.

    The model's; a model without them falls back to those of the data ``schema`` was written
    with, while its files exist (:func:`~ssl_rec.vocab.schema_vocabularies`), else ``None``.
    """
    if backbone.vocabulary is not None:
        return backbone.vocabulary
    return schema_vocabularies(schema)


def entity_values(
    vocabularies: Vocabularies | None, schema: FeatureSchema, field: str
) -> np.ndarray:
    """Raw value of each id of ``field`` (``str[card]``; id 0 = ``"<missing>"``).

    From ``vocabularies`` (:func:`export_vocabularies`); without them, the ids themselves.
    """
    if vocabularies is not None:
        return np.asarray(vocabularies.id_values(field).to_pylist(), dtype=str)
    return np.arange(schema.field(field).cardinality).astype(str)


def entity_ids(values: np.ndarray) -> np.ndarray:
    """``int64[n]`` ids worth indexing: not the reserved id 0, not an unused hash bucket."""
    ids = np.arange(len(values), dtype=np.int64)
    return ids[(ids != MISSING_ID) & (values != UNUSED_VALUE)]


def _checkpoint_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a checkpoint file (of a sharded checkpoint directory: of its files' listing).

    The listing is the sorted JSON of every file's ``sha256:<hex>`` by name.
    """
    if not os.path.isdir(path):
        return file_sha256(path)
    listing = json.dumps(directory_checksums(path, algorithm="sha256"), sort_keys=True)
    return hashlib.sha256(listing.encode()).hexdigest()


def export_embeddings(
    model: nn.Module,
    schema: FeatureSchema | None,
    out: str | os.PathLike[str],
    fields: Sequence[str] | None = None,
    *,
    config: IndexConfig | None = None,
    representations: Mapping[str, RepresentationSet] | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """Write entity embeddings (and optionally split representations) with FAISS indexes.

    The directory is built in a temporary sibling and renamed into place at the end, so an
    interrupted export leaves nothing at ``out`` that :class:`EmbeddingIndex` would load.

    Args:
        model: a Backbone, or a CTRModule / PretrainModule (anything with ``.backbone``).
        schema: the feature schema; ``None`` takes ``model.schema``.
        out: export directory.
        fields: categorical fields to export; ``None`` exports every field, ``[]`` none.
        config: index and storage options (:class:`IndexConfig`).
        representations: split name -> :class:`RepresentationSet` to export as
            ``split_<name>`` sets (see :func:`compute_representations`).
        checkpoint: source checkpoint, hashed into the manifest.
        overwrite: replace an existing ``out``.
        progress: show tqdm bars.

    Returns:
        The export directory path.

    Example:
        >>> export_embeddings(module, None, "runs/export", ["C1"])  # doctest: +SKIP

    """
    config = config or IndexConfig()
    backbone = backbone_of(model)
    schema = schema if schema is not None else backbone.schema
    fields = schema.field_names if fields is None else list(fields)
    for name in fields:
        schema.field(name)
    if not fields and not representations:
        raise ValueError("export_embeddings: nothing to export (no fields and no representations)")
    clash = [f"split_{split}" for split in representations or {} if f"split_{split}" in fields]
    if clash:
        raise ValueError(f"export_embeddings: fields {clash} have the set names of the "
                         "representation sets; export them and the split separately")  # fmt: skip
    source = None
    if checkpoint is not None:
        source = {"path": os.path.basename(checkpoint), "sha256": _checkpoint_sha256(checkpoint)}
    vocabularies = export_vocabularies(backbone, schema)
    with atomic_directory(out, overwrite=overwrite) as tmp:
        sets: dict[str, VectorSet] = {}
        for name in fields:
            sets[name] = _write_entities(tmp, model, vocabularies, schema, name, config, progress)
        for split, reps in (representations or {}).items():
            name = f"split_{split}"
            sets[name] = _write_set(
                tmp,
                VectorSet(name, "representation", 0, 0, {}, {}, split=split),
                reps.vectors,
                reps.row_ids.astype(np.int64),
                reps.labels,
                config,
                progress,
            )
        vocabulary = None
        if vocabularies is not None:
            vocabulary = vocabularies.save(tmp / VOCABULARY_FILENAME).name
        manifest = Manifest(schema.to_dict(), config.metric, config.precision, config.normalize,
                            sets, source, vocabulary=vocabulary,
                            checksums=directory_checksums(tmp, [MANIFEST_FILENAME]))  # fmt: skip
        atomic_write_json(tmp / MANIFEST_FILENAME, manifest.to_dict())
    return Path(out)


def _write_entities(
    tmp: Path,
    model: nn.Module,
    vocabularies: Vocabularies | None,
    schema: FeatureSchema,
    name: str,
    config: IndexConfig,
    progress: bool,
) -> VectorSet:
    values = entity_values(vocabularies, schema, name)
    ids = entity_ids(values)
    if len(ids) == 0:
        raise ValueError(f"field {name!r} has no entity besides the reserved id 0 to export")
    vectors = entity_vectors(model, name, len(values), progress)[ids]
    ids_file = f"{safe_file_name(name)}.ids.npy"
    stub = VectorSet(name, "entity", 0, 0, {"ids": ids_file}, {}, field=name)
    np.save(tmp / stub.files["ids"], ids)
    written = _write_set(tmp, stub, vectors, values[ids], None, config, progress)
    written.index["excluded_ids"] = {"missing": 1, "unused": len(values) - len(ids) - 1}
    return written


def _write_set(
    tmp: Path,
    stub: VectorSet,
    vectors: np.ndarray,
    keys: np.ndarray,
    labels: np.ndarray | None,
    config: IndexConfig,
    progress: bool,
) -> VectorSet:
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if config.normalize:
        faiss.normalize_L2(vectors)
    n, dim = vectors.shape
    codes, quantizer = encode_vectors(vectors, config.precision)
    stem = safe_file_name(stub.name)
    files = {
        **stub.files,
        "vectors": f"{stem}.vectors.npy",
        "keys": f"{stem}.keys.npy",
        "index": f"{stem}.faiss",
    }
    np.save(tmp / files["vectors"], codes)
    np.save(tmp / files["keys"], keys, allow_pickle=False)
    if quantizer is not None:
        files["quantizer"] = f"{stem}.quantizer.npy"
        np.save(tmp / files["quantizer"], quantizer)
    if labels is not None:
        files["labels"] = f"{stem}.labels.npy"
        np.save(tmp / files["labels"], np.asarray(labels, np.float32))
    factory = resolve_factory(config.index, n, dim, config.precision)
    if progress:
        tqdm.write(f"indexing {stub.name}: {n} x {dim} with {factory!r}")
    index, built, note = build_index_or_exact(
        vectors, factory, config.metric, config.train_size, config.seed, config.precision
    )
    if note:
        log.warning("set %s: %s", stub.name, note)
    write_faiss_index(index, tmp / files["index"])
    info = {
        "requested": config.index,
        "factory": built,
        "train_size": config.train_size,
        "search_params": default_search_params(index),
    }
    if note:
        info["fallback"] = note
    return VectorSet(stub.name, stub.kind, n, dim, files, info, stub.field, stub.split)
