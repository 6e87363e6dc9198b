"""FeatureSchema: names and sizes of a data set's columns, saved beside every artifact."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ssl_rec._io import atomic_write_json, read_json

SCHEMA_FILENAME = "schema.json"
SCHEMA_VERSION = 1
CRITEO_LABEL = "label"
CRITEO_DENSE = tuple(f"I{i}" for i in range(1, 14))
CRITEO_CATEGORICAL = tuple(f"C{i}" for i in range(1, 27))
MISSING_ID = 0


@dataclass(frozen=True)
class CategoricalField:
    """One categorical column.

    Args:
        name: column name, e.g. ``"C1"``.
        cardinality: number of ids including the reserved id 0 (missing / rare /
            out-of-vocabulary), so valid ids are ``0..cardinality-1``.

    """

    name: str
    cardinality: int

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("CategoricalField.name must be a non-empty string")
        if int(self.cardinality) < 2:
            raise ValueError(
                f"CategoricalField {self.name!r}: cardinality must be >= 2 (id 0 is reserved), "
                f"got {self.cardinality}"
            )


@dataclass(frozen=True)
class FeatureSchema:
    """Dense columns, categorical fields with cardinalities, and the label column.

    Args:
        dense: names of the dense (numeric) columns, in order; ``n_dense = len(dense)``.
        categorical: the categorical fields, in order; ``F = len(categorical)``.
        label: name of the binary label column, or ``None`` for unlabeled data.
        metadata: free-form JSON-able facts about the data (source, preprocessing options,
            oracle metrics of synthetic data, ``vocabulary_file`` where raw values of ids
            live, ...).

    Example:
        >>> s = FeatureSchema(["I1"], [CategoricalField("C1", 10)], "label")
        >>> FeatureSchema.from_dict(s.to_dict()) == s
        True

    """

    dense: tuple[str, ...]
    categorical: tuple[CategoricalField, ...]
    label: str | None = CRITEO_LABEL
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dense", tuple(self.dense))
        object.__setattr__(self, "categorical", tuple(self.categorical))
        names = [*self.dense, *(f.name for f in self.categorical)]
        if self.label is not None:
            names.append(self.label)
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"FeatureSchema: column names appear more than once: {dupes}")
        if not self.categorical and not self.dense:
            raise ValueError("FeatureSchema needs at least one dense or categorical column")

    @property
    def n_dense(self) -> int:
        """Number of dense columns."""
        return len(self.dense)

    @property
    def n_fields(self) -> int:
        """Number of categorical fields ``F``."""
        return len(self.categorical)

    @property
    def field_names(self) -> list[str]:
        """Categorical field names in order."""
        return [f.name for f in self.categorical]

    @property
    def cardinalities(self) -> list[int]:
        """Cardinality of each categorical field, in order."""
        return [f.cardinality for f in self.categorical]

    def field(self, name: str) -> CategoricalField:
        """Return the categorical field called ``name`` (``KeyError`` naming the known ones)."""
        for f in self.categorical:
            if f.name == name:
                return f
        raise KeyError(f"unknown categorical field {name!r}; schema has {self.field_names}")

    def field_index(self, name: str) -> int:
        """Position of categorical field ``name`` in ``sparse[:, F]``."""
        return self.field_names.index(self.field(name).name)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (inverse of :meth:`from_dict`)."""
        return {
            "version": SCHEMA_VERSION,
            "dense": list(self.dense),
            "categorical": [asdict(f) for f in self.categorical],
            "label": self.label,
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FeatureSchema:
        """Build from :meth:`to_dict` output; raises ``ValueError`` on a bad document."""
        if not isinstance(data, dict):
            raise ValueError(f"FeatureSchema: expected a JSON object, got {type(data).__name__}")
        version = data.get("version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"FeatureSchema: format version {version} is not supported "
                f"(this version reads {SCHEMA_VERSION})"
            )
        missing = [k for k in ("dense", "categorical") if k not in data]
        if missing:
            raise ValueError(f"FeatureSchema: missing keys {missing}")
        fields = []
        for i, f in enumerate(data["categorical"]):
            try:
                fields.append(CategoricalField(str(f["name"]), int(f["cardinality"])))
            except (KeyError, TypeError) as e:
                raise ValueError(f"FeatureSchema: categorical[{i}] is malformed: {f!r}") from e
        return cls(
            tuple(data["dense"]), tuple(fields), data.get("label"), dict(data.get("metadata", {}))
        )

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``schema.json`` into ``directory`` atomically and return its path."""
        return atomic_write_json(Path(directory) / SCHEMA_FILENAME, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> FeatureSchema:
        """Read a schema from ``schema.json`` or a directory holding it."""
        path = Path(path)
        if path.is_dir():
            path = path / SCHEMA_FILENAME
        if not path.is_file():
            raise FileNotFoundError(f"no feature schema at {path}")
        return cls.from_dict(read_json(path))
