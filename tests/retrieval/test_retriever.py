"""Export of the query tower and item vectors; Retriever.load(DIR).topk(rows, k)."""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch

from ssl_rec.evaluation import Retriever, export_retrieval
from ssl_rec.hardware import TableSpec
from ssl_rec.models import TowerEncoder, TwoTowerModel
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch

SCHEMA = FeatureSchema(
    ("age",),
    (CategoricalField("user", 50), CategoricalField("item", 40), CategoricalField("genre", 6)),
    None,
)


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


def test_loaded_retriever_ranks_like_the_trained_towers(tmp_path) -> None:
    model = towers()
    items, ids = catalogue()
    out = export_retrieval(model, items, ids, tmp_path / "export")
    retriever = Retriever.load(out)
    scores, top = retriever.topk(queries(), 5)
    model.eval()
    with torch.no_grad():
        expected = model.encode_queries(queries()) @ model.encode_items(items).T
    want = torch.topk(expected, 5, dim=1)
    torch.testing.assert_close(scores, want.values, atol=1e-5, rtol=0)
    assert torch.equal(top, ids[want.indices])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["query_fields"] == ["user", "age"] and manifest["n_items"] == 39
    with pytest.raises(FileExistsError):
        export_retrieval(model, items, ids, out)


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
    with pytest.raises(ValueError, match="not a retrieval export"):
        Retriever.load(tmp_path)
