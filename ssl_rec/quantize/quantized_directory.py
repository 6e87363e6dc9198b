"""A quantized model directory: everything needed to serve it, without its training code.

Layout::

    DIR/schema.json     the feature schema (its ``vocabulary_file`` is DIR/vocabulary.arrow)
    DIR/manifest.json   format, architecture of the dense part, the plan, source, data
    DIR/model.pt        table stores and dense state (``torch.load(weights_only=True)``)
    DIR/report.json     the quantization report
    DIR/vocabulary.arrow  the trained model's vocabularies (:class:`Vocabularies`), which
                        encode new data for it and give the raw value of every id
                        (absent when neither the model nor its data had them)

The directory is written to a temporary sibling and renamed into place, so an interrupted
write leaves nothing at ``DIR`` that :func:`load_quantized` would read. The manifest, written
last, records the CRC-32 of every other file (``checksums``); the readers below check the
files they read against it (a directory written before checksums is read unchecked). A
directory written before ``vocabulary.arrow`` may hold ``DIR/vocab/<field>.arrow`` instead,
which :func:`read_vocabularies` reads when ``vocabulary.arrow`` is absent.
"""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ssl_rec._io import (
    atomic_directory,
    atomic_write_bytes,
    atomic_write_json,
    directory_checksums,
    read_json,
    verify_file,
)
from ssl_rec.class_paths import UntrustedClassPath, check_class_paths
from ssl_rec.quantize.dense import TORCHAO_PRECISIONS, import_torchao
from ssl_rec.quantize.model import Architecture, InferenceCTRModel, load_dense_state
from ssl_rec.quantize.quantization_plan import QuantizationPlan
from ssl_rec.quantize.serving_wide import ServingWide
from ssl_rec.quantize.tables import QuantizedTables
from ssl_rec.schema import SCHEMA_FILENAME, FeatureSchema
from ssl_rec.vocab import (
    LEGACY_VOCAB_DIR_KEY,
    LEGACY_VOCAB_DIRNAME,
    VOCABULARY_FILE_KEY,
    VOCABULARY_FILENAME,
    Vocabularies,
    find_vocabularies,
    schema_vocabularies,
)

__all__ = [
    "MANIFEST_FILENAME",
    "MODEL_FILENAME",
    "REPORT_FILENAME",
    "is_quantized_dir",
    "load_quantized",
    "read_manifest",
    "read_report",
    "read_vocabularies",
    "save_quantized",
    "verify_quantized_file",
]

MANIFEST_FILENAME = "manifest.json"
MODEL_FILENAME = "model.pt"
REPORT_FILENAME = "report.json"
KIND = "ssl_rec.quantized_ctr"
FORMAT = 1


def save_quantized(
    model: InferenceCTRModel,
    out: str | os.PathLike[str],
    report: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    vocabularies: Vocabularies | None = None,
) -> Path:
    """Write ``model`` and its ``report`` as a quantized model directory.

    Args:
        model: the quantized model.
        out: the directory to create.
        report: written as ``report.json``.
        extra: more JSON-able manifest entries (``source`` checkpoint, ``data`` module
            hyperparameters, ...).
        overwrite: replace an existing ``out``.
        vocabularies: the trained model's vocabularies, kept so that new data is encoded
            with them (:func:`read_vocabularies`); ``None`` keeps those of the data the
            model's schema names, while its files exist.

    Returns:
        The directory path.

    """
    out = Path(out)
    if model.architecture is None:
        raise ValueError(
            "this model was built without an Architecture (how to rebuild its "
            "encoder and head), so it cannot be saved"
        )
    if vocabularies is None:
        vocabularies = schema_vocabularies(model.schema)
    with atomic_directory(out, overwrite=overwrite) as tmp:
        metadata = dict(model.schema.metadata)
        metadata.pop(LEGACY_VOCAB_DIR_KEY, None)
        metadata.pop(VOCABULARY_FILE_KEY, None)
        if vocabularies is not None:
            vocabularies.save(tmp / VOCABULARY_FILENAME)
            metadata[VOCABULARY_FILE_KEY] = str(out.resolve() / VOCABULARY_FILENAME)
        dataclasses.replace(model.schema, metadata=metadata).save(tmp)
        state = {"tables": model.tables.state_dict(), "dense": model.dense.state_dict()}
        if model.wide is not None:
            state["wide"] = model.wide.state_dict()
        # serialized in memory and written as bytes: torch.save to a path on a full disk
        # raises a RuntimeError that says nothing of space; a write raises ENOSPC
        buffer = io.BytesIO()
        torch.save(state, buffer)
        atomic_write_bytes(tmp / MODEL_FILENAME, buffer.getbuffer())
        atomic_write_json(tmp / REPORT_FILENAME, dict(report))
        manifest = {
            "kind": KIND,
            "format": FORMAT,
            "architecture": model.architecture.to_dict(),
            "plan": model.plan.to_dict(),
            **dict(extra or {}),
            "checksums": directory_checksums(tmp, exclude=[MANIFEST_FILENAME]),
        }
        atomic_write_json(tmp / MANIFEST_FILENAME, manifest)
    return out


def verify_quantized_file(path: str | os.PathLike[str], name: str,
                          manifest: Mapping[str, Any] | None = None) -> bool:  # fmt: skip
    """Check file ``name`` of a quantized model directory against its manifest's checksums.

    Args:
        path: the directory.
        name: the file's path relative to it (``"model.pt"``, ``"vocabulary.arrow"``, ...).
        manifest: the directory's manifest, when already read.

    Returns:
        Whether the manifest records the file (``False``: written before checksums, or a
        file the directory never had).

    Raises:
        ChecksumError: a ``ValueError`` naming the file when its bytes changed.
        FileNotFoundError: when a recorded file is missing.

    """
    manifest = read_manifest(path) if manifest is None else manifest
    checksums = manifest.get("checksums")
    if not isinstance(checksums, dict) or name not in checksums:
        return False
    file = Path(path) / name
    if not file.is_file():
        raise FileNotFoundError(f"{file}: missing, but {MANIFEST_FILENAME} records it")
    verify_file(file, checksums[name], f"re-run ssl-rec quantize to rewrite {path}")
    return True


def is_quantized_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory written by :func:`save_quantized`."""
    try:
        return read_manifest(path).get("kind") == KIND
    except UntrustedClassPath:
        raise  # it is one, naming a class it must not build: say so rather than "not one"
    except (FileNotFoundError, ValueError):
        return False


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a quantized model directory (``FileNotFoundError`` / ``ValueError``).

    Every class path in it (the encoder's, the recorded data module's) must be allowed
    (:mod:`ssl_rec.class_paths`), else :class:`UntrustedClassPath` names it.
    """
    file = Path(path) / MANIFEST_FILENAME
    if not file.is_file():
        raise FileNotFoundError(f"{path}: not a quantized model directory (no {MANIFEST_FILENAME})")
    manifest = read_json(file)
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        raise ValueError(f"{file}: not the manifest of a quantized ssl-rec model")
    if manifest.get("format") != FORMAT:
        raise ValueError(
            f"{file}: format {manifest.get('format')!r} is not supported "
            f"(this version reads {FORMAT})"
        )
    check_class_paths(manifest, str(file))
    return manifest


def read_vocabularies(path: str | os.PathLike[str]) -> Vocabularies | None:
    """The vocabularies saved in a quantized model directory (``None`` when it has none).

    Its ``vocabulary.arrow``; in a directory written before it, the ``vocab/<field>.arrow``
    files of every field. Each file is checked against the manifest's checksums first.
    """
    directory = Path(path)
    manifest = read_manifest(directory)

    def verify(file: Path) -> None:
        verify_quantized_file(directory, file.relative_to(directory).as_posix(), manifest)

    verify(directory / VOCABULARY_FILENAME)  # recorded but missing: FileNotFoundError
    verify(directory / SCHEMA_FILENAME)
    return find_vocabularies(directory, FeatureSchema.load(directory), verify)


def read_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``report.json`` of a quantized model directory (``{}`` when it has none)."""
    file = Path(path) / REPORT_FILENAME
    if not verify_quantized_file(path, REPORT_FILENAME) and not file.is_file():
        return {}
    return read_json(file)


def load_quantized(path: str | os.PathLike[str]) -> InferenceCTRModel:
    """Rebuild the model saved in a quantized model directory (read-only, on CPU)."""
    path = Path(path)
    manifest = read_manifest(path)
    verify_quantized_file(path, SCHEMA_FILENAME, manifest)
    schema = FeatureSchema.load(path)
    # The directory may have moved since it was written: point at its own vocabularies.
    if (path / VOCABULARY_FILENAME).is_file():
        moved = {VOCABULARY_FILE_KEY: str(path / VOCABULARY_FILENAME)}
    elif (path / LEGACY_VOCAB_DIRNAME).is_dir():
        moved = {LEGACY_VOCAB_DIR_KEY: str(path / LEGACY_VOCAB_DIRNAME)}
    else:
        moved = {}
    schema = dataclasses.replace(schema, metadata={**schema.metadata, **moved})
    try:
        architecture = Architecture(**manifest["architecture"])
        plan = QuantizationPlan.from_dict(manifest["plan"])
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path / MANIFEST_FILENAME}: malformed ({e})") from e
    if TORCHAO_PRECISIONS & set(plan.layers.values()):
        import_torchao()  # registers torchao's tensor types for weights-only loading
    file = path / MODEL_FILENAME
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no {MODEL_FILENAME}")
    verify_quantized_file(path, MODEL_FILENAME, manifest)
    state = torch.load(file, map_location="cpu", weights_only=True)
    precisions = [plan.tables[name] for name in schema.field_names]
    tables = QuantizedTables(schema.cardinalities, architecture.embedding_dim, precisions)
    tables.load_state_dict(state["tables"], assign=True)
    dense = architecture.build(schema)
    load_dense_state(dense, plan, state["dense"])
    wide = None
    if architecture.wide:
        if "wide" not in state:
            raise ValueError(f"{file}: the architecture has a wide term but the file has none")
        wide = ServingWide(schema.cardinalities, schema.n_dense)
        wide.load_state_dict(state["wide"])
    return InferenceCTRModel(schema, tables, dense, architecture, plan, wide)
