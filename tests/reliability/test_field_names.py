"""Field names are data, never paths: hostile column names stay inside every artifact.

A CSV whose columns are named ``../../x``, an absolute path, ``a/b``, ``..`` and so on is
fitted, exported and quantized; each command writes only inside the directories it owns, and
every artifact reads back. A manifest edited to name a file outside its directory is refused.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from ssl_rec._paths import inside, safe_file_name
from ssl_rec.cli import main
from ssl_rec.cli.errors import describe
from ssl_rec.evaluation import EmbeddingIndex
from ssl_rec.quantize import read_vocabularies
from ssl_rec.schema import FeatureSchema
from ssl_rec.vocab import Vocabularies, legacy_vocabulary_file, schema_vocabularies

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

# Names that, joined to a directory, would climb out of the cache entry or the cache.
CLIMBING = ["../../x", "../../../x/y"]
ODD = ["a/b", "..", ".", ".hidden", "naïve é", "CON", "a~b", "x" * 150]
QUIET = ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]


def _tree(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def _new_paths(root: Path, before: set[Path]) -> set[Path]:
    return _tree(root) - before


def _outside(paths: set[Path], allowed: list[Path]) -> list[str]:
    """Paths neither under one of ``allowed`` nor a directory made to hold one of them."""
    return sorted(str(p) for p in paths
                  if not any(p.is_relative_to(a) or (p.is_dir() and a.is_relative_to(p))
                             for a in allowed))  # fmt: skip


def _cache_allowed(cache: Path) -> list[Path]:
    """The cache's entries and their lock files, nothing else of the cache directory."""
    return [p for p in cache.iterdir() if p.name.startswith(("tabular-", ".tabular-"))]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Fit a 2-step DLRM on a CSV with hostile column names; snapshot what fit wrote."""
    root = tmp_path_factory.mktemp("fieldnames")
    absolute = str(root / "abs" / "x")  # an absolute name, kept inside the snapshot
    categorical = [*CLIMBING, absolute, *ODD]
    dense = ["../../dense", "/price"]
    rng = np.random.default_rng(0)
    data = root / "data"
    data.mkdir()
    with open(data / "clicks.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["clicked", *dense, *categorical])
        for u in rng.integers(0, 12, 400):
            clicked = int(rng.random() < (0.75 if u % 2 == 0 else 0.25))
            values = [f"u{u}"] + [f"v{i}_{u % (3 + i)}" for i in range(1, len(categorical))]
            writer.writerow([clicked, round(rng.gamma(2.0, 3.0), 2), round(rng.random(), 3),
                             *values])  # fmt: skip
    cache = root / "deep" / "er" / "cache"
    cache.mkdir(parents=True)
    out = root / "run"
    before = _tree(root)
    main(["fit", "--config", "configs/ctr/tabular.yaml", "--data.path",
          str(data / "clicks.csv"), "--data.label", "clicked", "--data.dense",
          json.dumps(dense), "--data.categorical", json.dumps(categorical), "--data.cache_dir",
          str(cache), "--data.batch_size", "64", "--trainer.default_root_dir", str(out),
          "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1", *QUIET])  # fmt: skip
    ckpt = out / "checkpoints" / "last.ckpt"
    return {"root": root, "cache": cache, "out": out, "categorical": categorical,
            "written": _new_paths(root, before), "ckpt": ckpt}  # fmt: skip


def test_safe_file_name_keeps_ordinary_names_and_escapes_the_rest() -> None:
    for name in ["C1", "user_id", "I13", "item-id.v2", "x" * 100]:
        assert safe_file_name(name) == name  # old caches and exports keep their layout
    others = ["/abs/x", "", "a%2Fb", "A/B", "a/b ", "con.txt", "nul", "é", "e\u0301"]
    names = [*CLIMBING, *ODD, *others]
    encoded = [safe_file_name(n) for n in names]
    assert len(set(encoded)) == len(names)  # two names never share a file
    for name, stem in zip(names, encoded, strict=True):
        assert "/" not in stem and "\\" not in stem and "\x00" not in stem
        assert stem not in ("", ".", "..") and not stem.startswith(".")
        assert len(stem.encode()) <= 100 and "~" in stem, (name, stem)
    # Stable across machines and versions: the hash is of the name alone.
    assert safe_file_name("a/b") == "a%2Fb~c14cddc033f64b9d"
    assert safe_file_name("..") == "%2E.~5ec1f7e700f37c3d"
    # Artifacts written before vocabulary.arrow are read from these per-field files.
    assert legacy_vocabulary_file("/v", "C1") == Path("/v/C1.arrow")
    assert legacy_vocabulary_file("/v", "a/b") == Path("/v/a%2Fb~c14cddc033f64b9d.arrow")
    with pytest.raises(TypeError):
        safe_file_name(3)  # type: ignore[arg-type]


def test_inside_refuses_absolute_parent_and_symlink_escapes(tmp_path: Path) -> None:
    art = tmp_path / "art"
    (art / "sub").mkdir(parents=True)
    (tmp_path / "secret").write_text("s")
    (art / "link").symlink_to(tmp_path / "secret")
    (art / "dirlink").symlink_to(tmp_path)
    assert inside(art, "sub/x.npy") == art / "sub" / "x.npy"
    where = art / "manifest.json"
    for bad in ["../secret", str(tmp_path / "secret"), "sub/../../secret", "link", "dirlink/secret",
                "", "a\x00b", "..\\secret", "C:\\x", None, 3]:  # fmt: skip
        with pytest.raises(ValueError) as info:
            inside(art, bad, where)
        message = str(info.value)
        assert message.startswith(f"{where}:") and "\n" not in message, message


def test_fit_writes_only_inside_the_cache_entry_and_its_run_directory(hostile: dict) -> None:
    cache, out = hostile["cache"], hostile["out"]
    written = hostile["written"]
    assert not _outside(written, [out, *_cache_allowed(cache)])
    entries = [p for p in cache.iterdir() if p.is_dir()]
    assert len(entries) == 1 and hostile["ckpt"].is_file()
    entry = entries[0]
    categorical = hostile["categorical"]
    # Field names are data in one vocabulary.arrow, never file names: no file per field.
    assert not (entry / "vocab").exists()
    files = {p.name for p in entry.iterdir() if p.is_file()}
    assert files == {"schema.json", "checksums.json", "vocabulary.arrow"}
    schema = FeatureSchema.load(entry)
    assert schema.field_names == categorical
    vocabularies = Vocabularies.load(entry / "vocabulary.arrow")
    assert vocabularies.names == categorical
    assert schema_vocabularies(schema).fingerprints() == vocabularies.fingerprints()
    for name in categorical:
        values = vocabularies.id_values(name)
        assert len(values) == schema.field(name).cardinality > 1
    assert set(vocabularies.id_values("../../x").to_pylist()[1:]) <= {f"u{u}" for u in range(12)}


@pytest.fixture(scope="module")
def exported(hostile: dict) -> dict:
    """``ssl-rec export --fields`` of hostile fields; what it wrote."""
    root = hostile["root"]
    export = root / "exports" / "e"
    fields = [*CLIMBING, hostile["categorical"][2], "a/b", ".."]
    before = _tree(root)
    main(["export", "--ckpt_path", str(hostile["ckpt"]), "--out", str(export), "--fields",
          json.dumps(fields)])  # fmt: skip
    return {"dir": export, "fields": fields, "written": _new_paths(root, before)}


def test_export_of_hostile_fields_stays_inside_and_reads_back(
    hostile: dict, exported: dict
) -> None:
    export = exported["dir"]
    assert not _outside(exported["written"], [export])
    assert all(p.is_file() and p.parent == export for p in export.iterdir())
    assert {p.name for p in export.glob("*.keys.npy")} == {
        f"{safe_file_name(n)}.keys.npy" for n in exported["fields"]
    }
    index = EmbeddingIndex.load(export)
    assert sorted(index.set_names) == sorted(exported["fields"])
    keys = index.keys("../../x").tolist()
    neighbours, scores = index.neighbors("../../x", keys[0], k=3)
    assert len(neighbours) == 3 and keys[0] not in neighbours and set(neighbours) <= set(keys)
    assert np.all(np.isfinite(scores))
    assert index.vocabulary.names == hostile["categorical"]


def test_quantize_of_hostile_fields_stays_inside_and_predicts(hostile: dict) -> None:
    root, cache = hostile["root"], hostile["cache"]
    quantized = root / "served" / "q"
    before = _tree(root)
    main(["quantize", "--ckpt_path", str(hostile["ckpt"]), "--out", str(quantized), "--budget_ne",
          "0.01", "--calibration_rows", "64", "--evaluation_rows", "64"])  # fmt: skip
    assert not _outside(_new_paths(root, before), [quantized, *_cache_allowed(cache)])
    assert not (quantized / "vocab").exists()  # one vocabulary.arrow, no file per field
    assert read_vocabularies(quantized).names == hostile["categorical"]
    pred = root / "pred.parquet"
    before = _tree(root)
    main(["predict", "--ckpt_path", str(quantized), "--out", str(pred)])
    assert not _outside(_new_paths(root, before), [pred, *_cache_allowed(cache)])
    probability = pq.read_table(pred).column("probability").to_numpy()
    assert len(probability) > 0 and np.all((probability > 0) & (probability < 1))


@pytest.mark.parametrize("where", ["set", "vocabulary"])
@pytest.mark.parametrize("bad", ["../outside.npy", "ABSOLUTE", "LINK"])
def test_export_manifest_naming_a_file_outside_is_refused(
    exported: dict, tmp_path: Path, where: str, bad: str
) -> None:
    export = tmp_path / "export"
    shutil.copytree(exported["dir"], export)
    secret = tmp_path / "outside.npy"
    np.save(secret, np.zeros(3))
    if bad == "ABSOLUTE":
        bad = str(secret)
    elif bad == "LINK":
        (export / "link.npy").symlink_to(secret)
        bad = "link.npy"
    manifest_path = export / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    if where == "set":
        manifest["sets"]["a/b"]["files"]["keys"] = bad
    else:
        manifest["vocabulary"] = bad
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError) as info:
        EmbeddingIndex.load(export)
    line = describe(info.value)
    assert "\n" not in line and str(manifest_path) in line and "not inside" in line, line
