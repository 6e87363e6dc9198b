"""Export of the query tower, item index and vocabularies; Retriever.load(DIR).topk(rows, k)."""

from __future__ import annotations

import json
from functools import partial

import numpy as np
import pyarrow as pa
import pytest
import torch

from ssl_rec._io import ChecksumError
from ssl_rec.evaluation import Retriever, export_retrieval
from ssl_rec.hardware import TableSpec
from ssl_rec.models import TowerEncoder, TwoTowerModel
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch
from ssl_rec.vocab import Vocabularies

SCHEMA = FeatureSchema(
    ("age",),
    (CategoricalField("user", 50), CategoricalField("item", 40), CategoricalField("genre", 6)),
    None,
)
# Raw values: user id i is "u<i>", item id i is "movie-<i>", genre id i is "g<i>".
VOCABULARY = Vocabularies.from_id_values({
    "user": pa.array(["<missing>", *[f"u{i}" for i in range(1, 50)]]),
    "item": pa.array(["<missing>", *[f"movie-{i}" for i in range(1, 40)]]),
    "genre": pa.array(["<missing>", *[f"g{i}" for i in range(1, 6)]]),
})  # fmt: skip
AGE_MEAN, AGE_STD = 30.0, 10.0


def towers() -> TwoTowerModel:
    torch.manual_seed(0)
    encoder = partial(TowerEncoder, hidden=[16], output_dim=8)
    return TwoTowerModel(SCHEMA, ["user", "age"], ["item", "genre"], embedding_dim=4,
                         tables=TableSpec(precision="int8", cache_fraction=0.25),
                         query_encoder=encoder, item_encoder=encoder)  # fmt: skip


def catalogue() -> tuple[Batch, torch.Tensor]:
    ids = torch.arange(1, 40)
    return Batch(torch.zeros(39, 0), torch.stack([ids, ids % 5 + 1], 1)), ids


def queries(n: int = 7) -> Batch:
    g = torch.Generator().manual_seed(1)
    sparse = torch.stack([torch.randint(1, 50, (n,), generator=g), torch.zeros(n, dtype=torch.long),
                          torch.zeros(n, dtype=torch.long)], 1)  # fmt: skip
    return Batch(torch.randn(n, 1, generator=g), sparse)


def expected_topk(model: TwoTowerModel, rows: Batch, k: int) -> torch.return_types.topk:
    model.eval()
    with torch.no_grad():
        scores = model.encode_queries(rows) @ model.encode_items(catalogue()[0]).T
    return torch.topk(scores, k, dim=1)


def test_loaded_retriever_ranks_like_the_trained_towers(tmp_path) -> None:
    model = towers()
    items, ids = catalogue()
    out = export_retrieval(model, items, ids, tmp_path / "export")
    retriever = Retriever.load(out)
    scores, top = retriever.topk_ids(queries(), 5)
    want = expected_topk(model, queries(), 5)
    torch.testing.assert_close(scores, want.values, atol=1e-5, rtol=0)
    assert torch.equal(top, ids[want.indices])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["query_fields"] == ["user", "age"] and manifest["n_items"] == 39
    assert manifest["index"]["factory"] == "Flat" and manifest["vocabulary"] is None
    assert sorted(manifest["checksums"]) == ["item_ids.npy", "item_keys.npy", "items.faiss",
                                             "query_tower.pt"]  # fmt: skip
    with pytest.raises(FileExistsError):
        export_retrieval(model, items, ids, out)


def test_raw_values_in_raw_item_keys_out(tmp_path) -> None:
    model = towers()
    items, ids = catalogue()
    out = export_retrieval(model, items, ids, tmp_path / "export", vocabulary=VOCABULARY,
                           dense_scaling={"age": (AGE_MEAN, AGE_STD)})  # fmt: skip
    retriever = Retriever.load(out)
    batch = queries()
    users = batch.sparse[:, 0].tolist()
    raw = {"user": [f"u{u}" for u in users],
           "age": (batch.dense[:, 0] * AGE_STD + AGE_MEAN).tolist()}  # fmt: skip
    want = expected_topk(model, batch, 5)
    scores, keys = retriever.topk(raw, 5)
    assert keys.tolist() == [[f"movie-{i}" for i in row] for row in ids[want.indices].tolist()]
    np.testing.assert_allclose(scores, want.values.numpy(), atol=1e-5, rtol=0)
    # Excluded keys (the row's history) never come back; the rest keep their order.
    seen = [keys[0, :2].tolist(), ["not-an-item"], *[[]] * 5]
    _, kept = retriever.topk(raw, 5, seen)
    assert kept[0].tolist() == keys[0, 2:].tolist() + kept[0, 3:].tolist()
    assert not set(kept[0].tolist()) & set(seen[0]) and kept[1].tolist() == keys[1].tolist()
    # A value never seen in training is encoded as missing (id 0), like a null.
    unseen, _ = retriever.encode({"user": ["u999", None], "age": [AGE_MEAN, None]})
    assert unseen.sparse[:, 0].tolist() == [0, 0] and unseen.dense[:, 0].tolist() == [0.0, 0.0]


def test_an_approximate_index_from_the_factory(tmp_path) -> None:
    model = towers()
    items, ids = catalogue()
    out = export_retrieval(model, items, ids, tmp_path / "export", index="IVF2,Flat")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["index"]["factory"] == "IVF2,Flat"
    assert manifest["index"]["search_params"] == {"nprobe": 2}  # every list: exact here
    top = Retriever.load(out).topk_ids(queries(), 5)[1]
    assert torch.equal(top, ids[expected_topk(model, queries(), 5).indices])


def test_a_damaged_export_is_refused_in_one_sentence(tmp_path) -> None:
    items, ids = catalogue()
    out = export_retrieval(towers(), items, ids, tmp_path / "export")
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "output_dim": "8"}))
    with pytest.raises(ValueError, match=r"missing or mistyped keys \['output_dim'\]"):
        Retriever.load(out)
    (out / "manifest.json").write_text(json.dumps({**manifest, "n_items": 38}))
    with pytest.raises(ValueError, match="do not match the manifest"):
        Retriever.load(out)
    (out / "manifest.json").write_text(json.dumps({**manifest, "version": 1}))
    with pytest.raises(ValueError, match="version 1, this ssl-rec reads 2"):
        Retriever.load(out)
    (out / "manifest.json").write_text(json.dumps(manifest))
    keys = np.load(out / "item_keys.npy")
    np.save(out / "item_keys.npy", keys[::-1].copy())  # same size, other bytes
    with pytest.raises(ChecksumError, match=r"item_keys\.npy: corrupt"):
        Retriever.load(out)
    with pytest.raises(ValueError, match="not a retrieval export"):
        Retriever.load(tmp_path)
