"""One vocabulary format on disk: ``vocabulary.arrow``; the per-field files of artifacts written
before it (``vocab/<field>.arrow``) are read where it is absent, and never written again."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pytest

from ssl_rec._io import ChecksumError, directory_checksums
from ssl_rec.data import SyntheticCTRDataModule
from ssl_rec.evaluation import EmbeddingIndex, IndexConfig, export_embeddings
from ssl_rec.models import Backbone, DLRMEncoder
from ssl_rec.quantize import read_vocabularies
from ssl_rec.quantize.quantized_directory import FORMAT, KIND, MANIFEST_FILENAME
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.vocab import (
    CodedColumn,
    Vocabularies,
    Vocabulary,
    find_vocabularies,
    legacy_vocabulary_file,
    schema_vocabularies,
    string_buffers,
    strings_from_buffers,
)

HOSTILE = "../../x"


def _vocabularies() -> Vocabularies:
    """A kept-value field, a hashed one, one whose every value was rare, a hostile name."""
    fields = {
        "user": Vocabulary.fit(pa.array(["a", "b", "c", "d"]), np.array([5, 3, 3, 1]), 2),
        "item": Vocabulary.hashed_buckets(7),
        "shop": Vocabulary.fit(pa.array(["x", "y"]), np.array([1, 1]), 2),
        HOSTILE: Vocabulary.fit(pa.array(["u1", "u2"]), np.array([4, 2]), 2),
    }
    return Vocabularies(fields, min_frequency=2)


def _schema(vocabularies: Vocabularies, **metadata: object) -> FeatureSchema:
    cards = zip(vocabularies.names, vocabularies.cardinalities, strict=True)
    fields = [CategoricalField(name, cardinality) for name, cardinality in cards]
    return FeatureSchema(["price"], fields, "label", dict(metadata))


def _write_per_field_files(vocabularies: Vocabularies, directory: Path) -> Path:
    """Write ``<directory>/vocab/<field>.arrow`` as ssl-rec did before ``vocabulary.arrow``."""
    vocab_dir = directory / "vocab"
    vocab_dir.mkdir(parents=True)
    for name, vocab in vocabularies.fields.items():
        table = pa.table({"value": vocab.id_values()})
        feather.write_feather(table, str(legacy_vocabulary_file(vocab_dir, name)),
                              compression="uncompressed")  # fmt: skip
    return vocab_dir


def test_string_buffers_are_the_bytes_and_offsets_of_any_string_array() -> None:
    values = ["", "ab", "ééé", "longer than 8 bytes", "z"]
    for array in (pa.array(values), pa.array(values, pa.large_string()),
                  pa.chunked_array([values[:2], values[2:]]),
                  pa.array(["pad", *values])[1:]):  # fmt: skip
        data, offsets = string_buffers(array)
        assert offsets.dtype == np.int64 and offsets[0] == 0 and len(offsets) == len(values) + 1
        assert bytes(data) == "".join(values).encode()
        assert strings_from_buffers(data, offsets).to_pylist() == values
    data, offsets = string_buffers(pa.array([], pa.string()))
    assert data.size == 0 and offsets.tolist() == [0]


@pytest.mark.parametrize("hashed_fields", [["item"], None])
def test_per_field_files_of_an_older_artifact_read_back_as_the_same_vocabularies(
    tmp_path: Path, hashed_fields: list[str] | None
) -> None:
    original = _vocabularies()
    _write_per_field_files(original, tmp_path)
    # Schemas of old entries listed their hashed fields; the file alone (dictionary-encoded
    # "<hashed>" buckets) says it too.
    schema = _schema(original, hashed_fields=hashed_fields, options={"min_frequency": 2})
    found = find_vocabularies(tmp_path, schema)
    assert found is not None and found.names == original.names
    assert found.fingerprints() == original.fingerprints()  # ids mean what they meant
    assert found.min_frequency == 2 and found["item"].hashed and not found["user"].hashed
    assert found["shop"].cardinality == 2 and len(found["shop"].values) == 0
    column = CodedColumn.from_column(pa.array(["b", None, "d", "zz", "a"]))
    for name in original.names:
        np.testing.assert_array_equal(found[name].encode(column), original[name].encode(column))
        assert found.id_values(name).to_pylist() == original.id_values(name).to_pylist()
    assert find_vocabularies(tmp_path) is None  # without the schema they cannot be read


def test_vocabulary_arrow_is_read_in_preference_to_per_field_files(tmp_path: Path) -> None:
    original = _vocabularies()
    _write_per_field_files(original, tmp_path)
    newer = Vocabularies({n: Vocabulary.hashed_buckets(c) for n, c in
                          zip(original.names, original.cardinalities, strict=True)})  # fmt: skip
    newer.save(tmp_path / "vocabulary.arrow")
    seen: list[str] = []
    found = find_vocabularies(tmp_path, _schema(original), lambda f: seen.append(f.name))
    assert found.fingerprints() == newer.fingerprints() != original.fingerprints()
    assert seen == ["vocabulary.arrow"]  # the file read is the file checked


def test_a_per_field_file_of_the_wrong_length_is_named_and_a_missing_one_reads_nothing(
    tmp_path: Path,
) -> None:
    original = _vocabularies()
    vocab_dir = _write_per_field_files(original, tmp_path)
    bad = legacy_vocabulary_file(vocab_dir, "user")
    feather.write_feather(pa.table({"value": pa.array(["<missing>", "a"])}), str(bad))
    with pytest.raises(ValueError) as info:
        find_vocabularies(tmp_path, _schema(original))
    message = str(info.value)
    assert message.startswith(str(bad)) and "2 values" in message and "'user'" in message
    bad.unlink()
    assert find_vocabularies(tmp_path, _schema(original)) is None


def test_new_data_writes_one_vocabulary_file_and_its_schema_names_it(tmp_path: Path) -> None:
    data = SyntheticCTRDataModule(n_train=300, n_val=50, n_test=50, cache_dir=str(tmp_path))
    entry = data.data_dir
    assert not (entry / "vocab").exists() and (entry / "vocabulary.arrow").is_file()
    metadata = data.schema.metadata
    assert "vocab_dir" not in metadata
    assert metadata["vocabulary_file"] == str(entry / "vocabulary.arrow")
    assert data.vocabulary.fingerprints() == metadata["vocabulary"]
    assert schema_vocabularies(data.schema).fingerprints() == metadata["vocabulary"]


def _old_quantized_dir(directory: Path, vocabularies: Vocabularies) -> Path:
    """A quantized directory as written before ``vocabulary.arrow``: ``vocab/`` + checksums."""
    directory.mkdir()
    schema = _schema(vocabularies, vocab_dir=str(directory / "vocab"))
    schema.save(directory)
    _write_per_field_files(vocabularies, directory)
    checksums = directory_checksums(directory, exclude=[MANIFEST_FILENAME])
    manifest = {"kind": KIND, "format": FORMAT, "checksums": checksums}
    (directory / MANIFEST_FILENAME).write_text(json.dumps(manifest))
    return directory


def test_a_quantized_directory_written_before_reads_and_checks_its_per_field_files(
    tmp_path: Path,
) -> None:
    original = _vocabularies()
    directory = _old_quantized_dir(tmp_path / "q", original)
    assert read_vocabularies(directory).fingerprints() == original.fingerprints()
    changed = legacy_vocabulary_file(directory / "vocab", HOSTILE)
    data = bytearray(changed.read_bytes())
    data[len(data) // 2] ^= 0x01
    changed.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="vocab/"):
        read_vocabularies(directory)


@pytest.mark.parametrize("layout", ["per_field_files", "vocabulary_arrow"])
def test_an_export_of_a_model_without_vocabularies_names_values_with_its_datas(
    tmp_path: Path, layout: str
) -> None:
    original = _vocabularies()
    data_dir = tmp_path / "entry"
    if layout == "per_field_files":
        _write_per_field_files(original, data_dir)
        schema = _schema(original, vocab_dir=str(data_dir / "vocab"))
    else:
        file = original.save(data_dir / "vocabulary.arrow")
        schema = _schema(original, vocabulary_file=str(file))
    encoder = partial(DLRMEncoder, bottom=[8], top=[8])
    backbone = Backbone(schema, embedding_dim=8, encoder=encoder, seed=0)
    assert backbone.vocabulary is None  # e.g. a checkpoint saved before models carried them
    out = export_embeddings(backbone, schema, tmp_path / "export", ["user", HOSTILE],
                            config=IndexConfig("Flat"), progress=False)  # fmt: skip
    index = EmbeddingIndex.load(out)
    assert sorted(index.keys("user").tolist()) == ["a", "b", "c"]
    assert sorted(index.keys(HOSTILE).tolist()) == ["u1", "u2"]
    assert index.vocabulary.fingerprints() == original.fingerprints()
    assert not (out / "vocab").exists()
