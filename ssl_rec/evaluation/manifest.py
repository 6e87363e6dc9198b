"""The export manifest: what an export directory holds, and the checks made when reading it.

``manifest.json`` is the one file a reader trusts; it names every other file, so a
directory without a valid manifest (an interrupted or foreign export) never loads. It
records every other file's CRC-32 (``checksums``), checked as each file is read.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ssl_rec._io import file_checksum, verify_file
from ssl_rec.evaluation.faiss_index import check_metric, check_precision

MANIFEST_FILENAME = "manifest.json"
FORMAT_VERSION = 1
FORMAT_NAME = "ssl-rec-embeddings"
SetKind = Literal["entity", "representation"]


@dataclass(frozen=True)
class VectorSet:
    """One exported set of vectors with its FAISS index.

    Args:
        name: set name: the field name for entities, ``split_<split>`` for representations.
        kind: ``entity`` (one vector per vocabulary id of ``field``) or ``representation``
            (one pooled vector per row of a data split).
        count: number of vectors ``n``.
        dim: vector dimension ``d``.
        files: role -> file name inside the export (``vectors``, ``keys``, ``index``,
            ``labels``, ``quantizer``).
        index: ``{"requested", "factory", "train_size", "search_params", "source"}``.
        field: categorical field name for entity sets, else ``None``.
        split: data split for representation sets, else ``None``.

    """

    name: str
    kind: SetKind
    count: int
    dim: int
    files: dict[str, str]
    index: dict[str, Any]
    field: str | None = None
    split: str | None = None


@dataclass(frozen=True)
class Manifest:
    """Contents of ``manifest.json``.

    Args:
        schema: the feature schema dict (``FeatureSchema.to_dict()``).
        metric: ``ip`` or ``l2``; scores are inner products or squared L2 distances.
        precision: stored precision of vectors and of the indexes' full-vector codes.
        normalized: whether vectors were L2-normalised before storage (cosine for ``ip``).
        sets: the exported :class:`VectorSet` s by name.
        source_checkpoint: ``{"path", "sha256"}`` of the checkpoint, or ``None``.
        vocabulary: file holding the model's vocabularies (``vocabulary.arrow``), or ``None``
            for a model without one.
        checksums: file name -> ``"crc32:<hex>"`` of every other file of the export, or
            ``None`` for an export written before checksums (read unchecked).
        format_version: :data:`FORMAT_VERSION` of the writer.

    """

    schema: dict[str, Any]
    metric: str
    precision: str
    normalized: bool
    sets: dict[str, VectorSet]
    source_checkpoint: dict[str, str] | None = None
    vocabulary: str | None = None
    checksums: dict[str, str] | None = None
    format_version: int = FORMAT_VERSION
    format: str = field(default=FORMAT_NAME)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form; sets are listed with their dims and counts for humans too."""
        data = asdict(self)
        data["fields"] = [s.field for s in self.sets.values() if s.kind == "entity"]
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "manifest") -> Manifest:
        """Validate and build; ``ValueError`` naming ``where`` and the offending key."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
        if data.get("format") != FORMAT_NAME:
            raise ValueError(
                f"{where}: not an ssl-rec embedding export (format={data.get('format')!r})"
            )
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise ValueError(
                f"{where}: format_version {version!r} is not supported; this ssl-rec reads "
                f"version {FORMAT_VERSION} (re-export with a matching ssl-rec)"
            )
        try:
            sets = {name: VectorSet(**s) for name, s in data["sets"].items()}
            manifest = cls(
                schema=dict(data["schema"]),
                metric=check_metric(data["metric"]),
                precision=check_precision(data["precision"]),
                normalized=bool(data["normalized"]),
                sets=sets,
                source_checkpoint=data.get("source_checkpoint"),
                vocabulary=data.get("vocabulary"),
                checksums=_checksums(data.get("checksums"), where),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{where}: malformed manifest ({type(e).__name__}: {e})") from e
        if not sets:
            raise ValueError(f"{where}: manifest lists no vector sets")
        return manifest

    @classmethod
    def read(cls, directory: str | os.PathLike[str]) -> Manifest:
        """Read ``<directory>/manifest.json`` with clear errors when missing or corrupt."""
        path = Path(directory) / MANIFEST_FILENAME
        if not Path(directory).is_dir():
            raise FileNotFoundError(f"no export directory at {directory}")
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing: {directory} is not a complete ssl-rec export"
            )
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: corrupt manifest, not valid JSON ({e})") from e
        return cls.from_dict(data, where=str(path))

    def verify(self, directory: str | os.PathLike[str], name: str) -> None:
        """Check file ``name`` of the export in ``directory`` against its recorded checksum.

        Raises:
            ChecksumError: a ``ValueError`` naming the file when its bytes changed, or when
                the manifest records checksums but not this file.

        """
        if self.checksums is None:
            return
        path = Path(directory) / name
        if name not in self.checksums:
            raise ValueError(f"{path}: not among the files {MANIFEST_FILENAME} has checksums of")
        verify_file(path, self.checksums[name], "export the checkpoint again (ssl-rec export)")


def _checksums(value: Any, where: str) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError(f"{where}: malformed manifest (checksums must map file names to strings)")
    return dict(value)


def file_sha256(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in ``chunk``-byte blocks."""
    return file_checksum(path, "sha256", chunk).partition(":")[2]
