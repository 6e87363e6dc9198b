"""A quantized model directory: everything needed to serve it, without its training code.

Layout::

    DIR/schema.json     the feature schema (its ``vocab_dir`` points at DIR/vocab)
    DIR/manifest.json   format, architecture of the dense part, the plan, source, data
    DIR/model.pt        table stores and dense state (``torch.load(weights_only=True)``)
    DIR/report.json     the quantization report
    DIR/vocab/          raw value of every id of every field, when the data has them
    DIR/vocabulary.arrow  the trained model's vocabularies (:class:`Vocabularies`), which
                        encode new data for it (absent when the model had none)

The directory is written to a temporary sibling and renamed into place, so an interrupted
write leaves nothing at ``DIR`` that :func:`load_quantized` would read.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ssl_rec._io import atomic_directory, atomic_write_json
from ssl_rec.quantize.dense import TORCHAO_PRECISIONS, import_torchao
from ssl_rec.quantize.model import Architecture, InferenceCTRModel, load_dense_state
from ssl_rec.quantize.plan import QuantizationPlan
from ssl_rec.quantize.tables import QuantizedTables
from ssl_rec.schema import FeatureSchema
from ssl_rec.vocabularies import Vocabularies

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
]

MANIFEST_FILENAME = "manifest.json"
MODEL_FILENAME = "model.pt"
REPORT_FILENAME = "report.json"
VOCAB_DIRNAME = "vocab"
VOCABULARY_FILENAME = "vocabulary.arrow"
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
            with them (:func:`read_vocabularies`).

    Returns:
        The directory path.

    """
    out = Path(out)
    if model.architecture is None:
        raise ValueError(
            "this model was built without an Architecture (how to rebuild its "
            "encoder and head), so it cannot be saved"
        )
    with atomic_directory(out, overwrite=overwrite) as tmp:
        metadata = dict(model.schema.metadata)
        vocab = metadata.get("vocab_dir")
        if vocab and Path(vocab).is_dir():
            shutil.copytree(vocab, tmp / VOCAB_DIRNAME)
            metadata["vocab_dir"] = str(out.resolve() / VOCAB_DIRNAME)
        dataclasses.replace(model.schema, metadata=metadata).save(tmp)
        manifest = {
            "kind": KIND,
            "format": FORMAT,
            "architecture": model.architecture.to_dict(),
            "plan": model.plan.to_dict(),
            **dict(extra or {}),
        }
        atomic_write_json(tmp / MANIFEST_FILENAME, manifest)
        state = {"tables": model.tables.state_dict(), "dense": model.dense.state_dict()}
        torch.save(state, tmp / MODEL_FILENAME)
        atomic_write_json(tmp / REPORT_FILENAME, dict(report))
        if vocabularies is not None:
            vocabularies.save(tmp / VOCABULARY_FILENAME)
    return out


def is_quantized_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory written by :func:`save_quantized`."""
    try:
        return read_manifest(path).get("kind") == KIND
    except (FileNotFoundError, ValueError):
        return False


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a quantized model directory (``FileNotFoundError`` / ``ValueError``)."""
    file = Path(path) / MANIFEST_FILENAME
    if not file.is_file():
        raise FileNotFoundError(f"{path}: not a quantized model directory (no {MANIFEST_FILENAME})")
    try:
        manifest = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{file}: not valid JSON ({e})") from e
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        raise ValueError(f"{file}: not the manifest of a quantized ssl-rec model")
    if manifest.get("format") != FORMAT:
        raise ValueError(
            f"{file}: format {manifest.get('format')!r} is not supported "
            f"(this version reads {FORMAT})"
        )
    return manifest


def read_vocabularies(path: str | os.PathLike[str]) -> Vocabularies | None:
    """The vocabularies saved in a quantized model directory (``None`` when it has none)."""
    file = Path(path) / VOCABULARY_FILENAME
    return Vocabularies.load(file) if file.is_file() else None


def read_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``report.json`` of a quantized model directory (``{}`` when it has none)."""
    file = Path(path) / REPORT_FILENAME
    if not file.is_file():
        return {}
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{file}: not valid JSON ({e})") from e


def load_quantized(path: str | os.PathLike[str]) -> InferenceCTRModel:
    """Rebuild the model saved in a quantized model directory (read-only, on CPU)."""
    path = Path(path)
    manifest = read_manifest(path)
    schema = FeatureSchema.load(path)
    if (path / VOCAB_DIRNAME).is_dir():  # the directory may have moved since it was written
        schema = dataclasses.replace(
            schema, metadata={**schema.metadata, "vocab_dir": str(path / VOCAB_DIRNAME)}
        )
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
    state = torch.load(file, map_location="cpu", weights_only=True)
    precisions = [plan.tables[name] for name in schema.field_names]
    tables = QuantizedTables(schema.cardinalities, architecture.embedding_dim, precisions)
    tables.load_state_dict(state["tables"], assign=True)
    dense = architecture.build(schema)
    load_dense_state(dense, plan, state["dense"])
    return InferenceCTRModel(schema, tables, dense, architecture, plan)
