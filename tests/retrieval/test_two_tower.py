"""Two towers: column routing, shapes, unit-norm outputs, low-precision tables, bad configs."""

from __future__ import annotations

import pytest
import torch

from ssl_rec.hardware import TableSpec
from ssl_rec.models import TowerEncoder, TwoTowerModel
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch

SCHEMA = FeatureSchema(
    ("age", "year"),
    (CategoricalField("user", 20), CategoricalField("item", 30), CategoricalField("genre", 5),
     CategoricalField("hour", 24)),
    "label",
)  # fmt: skip


def batch(n: int = 6, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    sparse = torch.stack([torch.randint(1, c, (n,), generator=g) for c in SCHEMA.cardinalities], 1)
    return Batch(torch.randn(n, 2, generator=g), sparse, torch.ones(n))


def model(**kwargs) -> TwoTowerModel:
    def encoder(f: int, n: int, d: int) -> TowerEncoder:
        return TowerEncoder(f, n, d, hidden=[16], output_dim=8)

    args = dict(query_fields=["user", "hour", "age"], item_fields=["item", "genre", "year"],
                embedding_dim=4, query_encoder=encoder, item_encoder=encoder)  # fmt: skip
    return TwoTowerModel(SCHEMA, **{**args, **kwargs})


def test_towers_read_their_own_columns_and_output_unit_vectors() -> None:
    torch.manual_seed(0)
    m = model()
    assert m.query_schema.field_names == ["user", "hour"] and m.query_schema.dense == ("age",)
    assert m.item_schema.field_names == ["item", "genre"] and m.item_schema.dense == ("year",)
    assert m.item_id_field == "item" and m.output_dim == 8
    b = batch()
    q, v = m(b)
    assert q.shape == v.shape == (6, 8)
    torch.testing.assert_close(q.norm(dim=1), torch.ones(6))
    torch.testing.assert_close(v.norm(dim=1), torch.ones(6))
    assert torch.equal(m.item_ids(b), b.sparse[:, 1])
    # Changing an item column moves only the item vectors, a query column only the queries.
    other_item = b.with_features(sparse=b.sparse.clone().index_fill_(1, torch.tensor([2]), 1))
    q2, v2 = m(other_item)
    assert torch.equal(q2, q) and not torch.allclose(v2, v)
    other_user = b.with_features(dense=b.dense.clone().index_fill_(1, torch.tensor([0]), 9.0))
    q3, v3 = m(other_user)
    assert torch.equal(v3, v) and not torch.allclose(q3, q)
    # The item catalogue is a batch of the item tower's columns alone.
    torch.testing.assert_close(m.encode_items(m.item_batch(b)), v)


def test_towers_train_on_int8_tables_with_an_fp32_cache() -> None:
    torch.manual_seed(0)
    spec = TableSpec(precision="int8", cache_fraction=0.5, learning_rate=0.5)
    m = model(tables=spec, table_overrides={"genre": TableSpec()})
    assert [s.precision.value for s in m.item_tower.table_specs] == ["int8", "fp32"]
    b = batch(16)
    before = m.item_tower.entity_vectors("item", m.item_ids(b)).clone()
    q, v = m(b)
    (q * v).sum().neg().backward()
    after = m.item_tower.entity_vectors("item", m.item_ids(b))
    assert not torch.allclose(before, after), "the fused optimizer did not update the table"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"item_fields": ["item", "user"]}, r"\['user'\] are listed for both towers"),
        ({"query_fields": ["user", "nope"]}, r"query_fields: unknown \['nope'\]"),
        ({"query_fields": ["age"]}, r"query_fields needs at least one categorical"),
        ({"item_id_field": "year"}, r"item_id_field='year'"),
        ({"item_encoder": lambda f, n, d: TowerEncoder(f, n, d, output_dim=5)}, r"8 and .* 5"),
    ],
)
def test_bad_tower_declarations_name_the_problem(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        model(**kwargs)
