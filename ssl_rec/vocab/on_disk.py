"""Where artifacts keep their vocabularies: one ``vocabulary.arrow`` file, read back here.

A data cache entry, a quantized model directory and an export hold their model's or data's
:class:`~ssl_rec.vocab.model_vocabularies.Vocabularies` as ``<dir>/vocabulary.arrow``, and a
schema written with the data names its file (``metadata["vocabulary_file"]``). Artifacts
written before that also held one ``<dir>/vocab/<field>.arrow`` per field (the raw value of
every id, field names encoded by :func:`~ssl_rec._paths.safe_file_name`) and their schemas
``metadata["vocab_dir"]``: :func:`find_vocabularies` reads those where ``vocabulary.arrow``
is absent, and nothing writes them any more.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather

from ssl_rec._paths import safe_file_name
from ssl_rec.schema import FeatureSchema
from ssl_rec.vocab.field_vocabulary import UNUSED_VALUE, Vocabulary
from ssl_rec.vocab.model_vocabularies import Vocabularies

VOCABULARY_FILENAME = "vocabulary.arrow"
VOCABULARY_FILE_KEY = "vocabulary_file"
LEGACY_VOCAB_DIRNAME = "vocab"
LEGACY_VOCAB_DIR_KEY = "vocab_dir"

Verify = Callable[[Path], object]
"""Called with each file before it is read (a checksum check that raises on a changed file)."""


def find_vocabularies(
    directory: str | os.PathLike[str],
    schema: FeatureSchema | None = None,
    verify: Verify | None = None,
) -> Vocabularies | None:
    """The vocabularies an artifact directory holds, or ``None`` when it holds none.

    Args:
        directory: a data cache entry, quantized model directory or export.
        schema: the artifact's schema; needed only to read the per-field files of an artifact
            written before ``vocabulary.arrow`` (their field names and cardinalities).
        verify: called with each file before it is read.

    Returns:
        ``<directory>/vocabulary.arrow`` read back; where it is absent, the per-field files
        ``<directory>/vocab/<field>.arrow`` of every ``schema`` field when all exist.

    Raises:
        ValueError: a file is not a vocabulary, or holds another number of ids than the
            schema's cardinality (naming the file).

    """
    directory = Path(directory)
    file = directory / VOCABULARY_FILENAME
    if file.is_file():
        if verify is not None:
            verify(file)
        return Vocabularies.load(file)
    legacy = directory / LEGACY_VOCAB_DIRNAME
    if schema is None or not schema.field_names or not legacy.is_dir():
        return None
    return _read_per_field_files(legacy, schema, verify)


def schema_vocabularies(schema: FeatureSchema) -> Vocabularies | None:
    """The vocabularies of the data ``schema`` was written with, while its files still exist.

    Found through ``metadata["vocabulary_file"]`` (or, for data written before it,
    ``metadata["vocab_dir"]``): what a model saved without its own vocabularies falls back to.

    Raises:
        ValueError: the files found do not match the schema's fields and cardinalities.

    """
    recorded = schema.metadata.get(VOCABULARY_FILE_KEY)
    old = schema.metadata.get(LEGACY_VOCAB_DIR_KEY)
    if isinstance(recorded, str) and recorded:
        found = Vocabularies.load(recorded) if Path(recorded).is_file() else None
        where = recorded
    elif isinstance(old, str) and old:
        found, where = find_vocabularies(Path(old).parent, schema), old
    else:
        return None
    if found is not None:
        found.check_schema(schema, where)
    return found


def legacy_vocabulary_file(vocab_dir: str | os.PathLike[str], field: str) -> Path:
    """The per-field file ``<vocab_dir>/<field>.arrow`` of artifacts written before.

    The field name is encoded by :func:`~ssl_rec._paths.safe_file_name`, so the path is
    always directly inside ``vocab_dir``.
    """
    return Path(vocab_dir) / f"{safe_file_name(field)}.arrow"


def _read_per_field_files(
    vocab_dir: Path, schema: FeatureSchema, verify: Verify | None
) -> Vocabularies | None:
    """Vocabularies from one file per field (column ``value``: the raw value of each id)."""
    hashed_fields = set(schema.metadata.get("hashed_fields") or ())
    options = schema.metadata.get("options")
    options = options if isinstance(options, dict) else {}
    paths = {name: legacy_vocabulary_file(vocab_dir, name) for name in schema.field_names}
    if not all(path.is_file() and not path.is_symlink() for path in paths.values()):
        return None
    fields = {}
    for field in schema.categorical:
        path = paths[field.name]
        if verify is not None:
            verify(path)
        try:
            values = feather.read_table(str(path), memory_map=True).column("value")
        except (pa.ArrowException, KeyError, OSError) as e:
            raise ValueError(f"{path}: not a vocabulary file ({type(e).__name__}: {e})") from e
        if len(values) != field.cardinality:
            raise ValueError(f"{path}: {len(values)} values but field {field.name!r} has "
                             f"cardinality {field.cardinality}")  # fmt: skip
        fields[field.name] = _from_id_values(values.combine_chunks(), field.name in hashed_fields)
    return Vocabularies(fields, int(options.get("min_frequency") or 1),
                        options.get("max_vocab_size"))  # fmt: skip


def _from_id_values(values: pa.Array, hashed: bool) -> Vocabulary:
    """The :class:`Vocabulary` whose :meth:`~Vocabulary.id_values` are ``values``.

    A hashed field's file is dictionary-encoded (``"<hashed>"`` per bucket); the one id of a
    field whose every value was rare is ``"<unused>"``.
    """
    cardinality = len(values)
    if hashed or pa.types.is_dictionary(values.type):
        return Vocabulary.hashed_buckets(cardinality)
    kept = values[1:].cast(pa.string())
    if cardinality == 2 and kept[0].as_py() == UNUSED_VALUE:
        kept = kept[:0]
    return Vocabulary(kept, np.arange(1, len(kept) + 1, dtype=np.int32), cardinality, False)
