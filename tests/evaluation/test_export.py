import json

import faiss
import numpy as np
import pytest
import torch

from ssl_rec.evaluation import (
    EmbeddingIndex,
    IndexConfig,
    compute_representations,
    export_embeddings,
    resolve_factory,
)
from ssl_rec.evaluation.manifest import MANIFEST_FILENAME


@pytest.mark.parametrize("precision,atol", [("fp32", 0.0), ("fp16", 2e-3), ("int8", 3e-2)])
def test_vector_equals_dequantized_row(tmp_path, backbone, schema, precision, atol):
    out = export_embeddings(
        backbone,
        schema,
        tmp_path / "exp",
        ["C1", "C2"],
        config=IndexConfig("Flat", precision=precision),
        progress=False,
    )
    idx = EmbeddingIndex.load(out)
    for field in ("C1", "C2"):
        card = schema.field(field).cardinality
        rows = backbone.entity_vectors(field, torch.arange(1, card)).numpy()
        got = np.stack([idx.vector(field, str(i)) for i in range(1, card)])
        if atol == 0.0:
            np.testing.assert_array_equal(got, rows)
        else:
            np.testing.assert_allclose(got, rows, atol=atol * np.abs(rows).max())
    manifest = json.loads((out / MANIFEST_FILENAME).read_text())
    assert manifest["precision"] == precision and manifest["fields"] == ["C1", "C2"]
    # The reserved missing id 0 is no entity: it is left out of the set and its index.
    assert manifest["sets"]["C1"]["count"] == 49 and manifest["sets"]["C1"]["dim"] == 8
    assert manifest["sets"]["C1"]["index"]["excluded_ids"] == {"missing": 1, "unused": 0}
    np.testing.assert_array_equal(np.load(out / "C1.ids.npy"), np.arange(1, 50))
    with pytest.raises(KeyError, match="unknown raw value"):
        idx.vector("C1", "0")


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_flat_search_matches_torch(tmp_path, backbone, schema, metric):
    out = export_embeddings(
        backbone,
        schema,
        tmp_path / "exp",
        ["C1"],
        config=IndexConfig("Flat", metric=metric),
        progress=False,
    )
    idx = EmbeddingIndex.load(out)
    items = backbone.entity_vectors("C1", torch.arange(1, 50))
    q = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    scores, keys = idx.search(q.numpy(), 4, "C1")
    ref = q @ items.T if metric == "ip" else -torch.cdist(q, items).square()
    top = ref.topk(4, dim=1)
    np.testing.assert_array_equal(keys.astype(int), top.indices.numpy() + 1)
    expected = top.values.numpy() if metric == "ip" else -top.values.numpy()
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-4)


def test_neighbors_exclude_self_and_rank(tmp_path, backbone, schema):
    idx = EmbeddingIndex.load(
        export_embeddings(
            backbone, schema, tmp_path / "e", ["C1"], config=IndexConfig("Flat"), progress=False
        )
    )
    values, scores = idx.neighbors("C1", "3", k=5)
    assert "3" not in values and len(values) == 5
    assert np.all(np.diff(scores) <= 1e-6)
    everything, _ = idx.neighbors("C1", "3", k=100)
    assert len(everything) == 48 and "0" not in everything  # the missing id never comes back


def test_index_too_big_for_a_small_field_falls_back_to_exact(tmp_path, backbone, schema):
    out = export_embeddings(backbone, schema, tmp_path / "e", ["C2"],
                            config=IndexConfig("IVF64,PQ8"), progress=False)  # fmt: skip
    info = json.loads((out / MANIFEST_FILENAME).read_text())["sets"]["C2"]["index"]
    assert info["requested"] == "IVF64,PQ8" and info["factory"] == "Flat"
    assert "6 of this set" in info["fallback"]
    idx = EmbeddingIndex.load(out)
    items = backbone.entity_vectors("C2", torch.arange(1, 7)).numpy()
    _, keys = idx.search(items, 1, "C2")
    assert keys[:, 0].tolist() == [str(i) for i in range(1, 7)]


def test_representation_set_roundtrip(tmp_path, backbone, schema, batches_of):
    reps = compute_representations(backbone, batches_of(schema, 200))
    out = export_embeddings(
        backbone,
        schema,
        tmp_path / "e",
        [],
        representations={"test": reps},
        config=IndexConfig("HNSW32", metric="l2"),
        progress=False,
    )
    idx = EmbeddingIndex.load(out)
    assert idx.set_names == ["split_test"]
    np.testing.assert_array_equal(idx.keys("split_test"), np.arange(200))
    np.testing.assert_array_equal(idx.labels("split_test"), reps.labels)
    _, keys = idx.search(reps.vectors[:3], 1)
    assert keys[:, 0].tolist() == [0, 1, 2]


def test_resolve_factory_avoids_polysemous_and_maps_precision():
    assert resolve_factory("IVF256,PQ16", 10**5, 64) == "IVF256,PQ16np"
    assert resolve_factory("PQ8x8", 10**5, 64) == "PQ8x8np"
    assert resolve_factory("OPQ16_64,IVF256,PQ16np", 10**5, 64) == "OPQ16_64,IVF256,PQ16np"
    assert (
        resolve_factory("IVF256,PQ32x4fs,RFlat", 10**5, 64, "fp16")
        == "IVF256,PQ32x4fs,Refine(SQfp16)"
    )
    assert resolve_factory("Flat", 10, 4, "int8") == "SQ8"
    assert resolve_factory("auto", 100, 64) == "Flat"
    assert resolve_factory("auto", 100_000, 64).endswith("PQ32x4fs,RFlat")


def test_auto_index_recall_on_clustered_data(tmp_path, backbone, schema):
    from ssl_rec.evaluation import build_index
    from ssl_rec.metrics import ann_recall_at_k

    rng = np.random.default_rng(0)
    centers = rng.normal(size=(200, 32)).astype(np.float32)
    x = centers[rng.integers(0, 200, 30_000)] + 0.3 * rng.normal(size=(30_000, 32)).astype(
        np.float32
    )
    index = build_index(x, resolve_factory("auto", len(x), 32), "ip")
    exact = faiss.IndexFlatIP(32)
    exact.add(x)
    q = x[:300] + 0.05 * rng.normal(size=(300, 32)).astype(np.float32)
    assert ann_recall_at_k(index.search(q, 10)[1], exact.search(q, 10)[1], 10) >= 0.9


def test_bad_inputs(tmp_path, backbone, schema):
    out = export_embeddings(
        backbone, schema, tmp_path / "e", ["C1"], config=IndexConfig("Flat"), progress=False
    )
    idx = EmbeddingIndex.load(out)
    with pytest.raises(KeyError, match="unknown raw value"):
        idx.vector("C1", "no-such-value")
    with pytest.raises(ValueError, match="dimension 8"):
        idx.search(np.zeros((2, 5), np.float32), 3)
    with pytest.raises(KeyError, match="no set"):
        idx.vector("C9", "1")
    with pytest.raises(FileExistsError):
        export_embeddings(backbone, schema, out, ["C1"], progress=False)
    with pytest.raises(KeyError, match="unknown categorical field"):
        export_embeddings(backbone, schema, tmp_path / "x", ["C9"], progress=False)
    with pytest.raises(ValueError, match="metric"):
        IndexConfig(metric="cos")
    with pytest.raises(ValueError, match="not a valid FAISS factory"):
        export_embeddings(
            backbone,
            schema,
            tmp_path / "y",
            ["C1"],
            config=IndexConfig("NoSuchIndex"),
            progress=False,
        )
    manifest = out / MANIFEST_FILENAME
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "format_version": 99}))
    with pytest.raises(ValueError, match="format_version 99"):
        EmbeddingIndex.load(out)
    manifest.write_text("{not json")
    with pytest.raises(ValueError, match="corrupt manifest"):
        EmbeddingIndex.load(out)
    manifest.unlink()
    with pytest.raises(FileNotFoundError, match="manifest.json is missing"):
        EmbeddingIndex.load(out)


def test_interrupted_export_leaves_nothing_loadable(tmp_path, backbone, schema, monkeypatch):
    calls, real = [], faiss.write_index

    def failing_write(index, path):
        calls.append(path)
        if len(calls) == 2:  # the second set's index: the first set is already on disk
            raise RuntimeError("disk full")
        real(index, path)

    monkeypatch.setattr(faiss, "write_index", failing_write)
    with pytest.raises(RuntimeError, match="disk full"):
        export_embeddings(backbone, schema, tmp_path / "e", ["C1", "C2"], progress=False)
    assert not (tmp_path / "e").exists()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError):
        EmbeddingIndex.load(tmp_path / "e")
