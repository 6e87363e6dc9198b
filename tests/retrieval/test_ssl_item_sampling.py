"""Item-side self-supervision: uniform catalogue draws and complementary masked views."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from test_retrieval_module import ITEMS, loader, module, rows, split, trainer

from ssl_rec.lightning import RetrievalModule
from ssl_rec.lightning.ssl_item_sampler import SslItemSampler
from ssl_rec.models import Backbone, TowerEncoder
from ssl_rec.objectives import ComplementaryInfoNCE
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch


def test_uniform_draws_are_distinct_seeded_and_uniform_over_the_catalogue() -> None:
    a, b, other = SslItemSampler("uniform", 10, seed=3), SslItemSampler("uniform", 10, seed=3), \
        SslItemSampler("uniform", 10, seed=4)  # fmt: skip
    draws = [a.catalogue_rows(50, 32) for _ in range(2000)]
    assert all(keep == 0 and len(r) == 10 and len(set(r.tolist())) == 10 for keep, r in draws)
    # The same seed repeats the sequence, another seed does not.
    assert all(torch.equal(r, b.catalogue_rows(50, 32)[1]) for _, r in draws[:20])
    assert not all(torch.equal(r, other.catalogue_rows(50, 32)[1]) for _, r in draws[:20])
    counts = torch.bincount(torch.cat([r for _, r in draws]), minlength=50).float()
    # 20,000 draws over 50 rows: 400 each expected, sd ~19; a skew of 25% would fail.
    assert counts.min() > 330 and counts.max() < 470


def test_batch_and_mixed_keep_the_batch_items_and_the_generator_state_resumes() -> None:
    assert SslItemSampler("batch").catalogue_rows(50, 32)[0] == 32
    assert len(SslItemSampler("batch").catalogue_rows(50, 32)[1]) == 0
    keep, drawn = SslItemSampler("mixed", 16).catalogue_rows(50, 32)
    assert keep == 8 and len(drawn) == 8
    keep, drawn = SslItemSampler("uniform", 0).catalogue_rows(50, 32)  # 0: the batch's size
    assert keep == 0 and len(drawn) == 32
    s = SslItemSampler("uniform", 5, seed=1)
    s.catalogue_rows(50, 8)
    state = s.state_dict()
    nxt = s.catalogue_rows(50, 8)[1]
    resumed = SslItemSampler("uniform", 5, seed=1)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.catalogue_rows(50, 8)[1], nxt)
    with pytest.raises(ValueError, match=r"ssl_items='popular'"):
        SslItemSampler("popular")


@pytest.mark.filterwarnings("ignore:.*self.log.*")
def test_the_module_feeds_catalogue_items_to_the_item_objectives() -> None:
    m = module(item_objectives={"cfm": ComplementaryInfoNCE()}, ssl_items="uniform",
               ssl_batch_size=ITEMS)  # fmt: skip
    batch = rows([(1, 3)] * 8)  # every row the same item
    items = m.ssl_item_batch(batch)
    item_col = m.towers.item_schema.field_names.index("item")
    # All 36 catalogue items once each, not the batch's single item.
    assert sorted(items.sparse[:, item_col].tolist()) == list(range(1, ITEMS + 1))
    mixed = module(item_objectives={"cfm": ComplementaryInfoNCE()}, ssl_items="mixed",
                   ssl_batch_size=8).ssl_item_batch(batch)  # fmt: skip
    assert mixed.sparse[:4, item_col].tolist() == [3, 3, 3, 3] and mixed.batch_size == 8
    loss = m.training_step(batch, 0)
    loss.backward()
    assert torch.isfinite(loss)
    no_catalogue = module(ssl_items="uniform")
    no_catalogue.catalogue = None
    with pytest.raises(ValueError, match="draws from the item catalogue"):
        no_catalogue.ssl_item_batch(batch)


class RecordingBackbone(Backbone):
    """A backbone that keeps the field masks it was called with."""

    masks: list

    def forward(self, batch, field_mask=None):
        self.masks.append(field_mask.clone())
        return super().forward(batch, field_mask)


def test_complementary_views_mask_disjoint_fields_covering_every_field() -> None:
    fields = [CategoricalField(f"f{i}", 10) for i in range(4)]
    encoder = partial(TowerEncoder, hidden=[8], output_dim=6)
    backbone = RecordingBackbone(FeatureSchema([], fields, None), 4, encoder=encoder)
    backbone.masks = []
    objective = ComplementaryInfoNCE(temperature=0.1, seed=0)  # correlated masking, 2 of 4
    objective.setup(backbone)
    batch = Batch(torch.zeros(16, 0), torch.randint(1, 10, (16, 4)))
    z1, z2 = objective.views(batch, backbone)
    first, second = backbone.masks
    assert torch.equal(second, ~first) and bool((first.sum(1) == 2).all())
    # Tower outputs compared as they are (no projection head): unit vectors of width H.
    assert z1.shape == z2.shape == (16, 6)
    assert torch.allclose(z1.norm(dim=1), torch.ones(16), atol=1e-5)
    out = objective(batch, backbone)
    out.loss.backward()
    assert torch.isfinite(out.loss) and set(out.logs) == {"loss", "alignment", "uniformity"}
    # The same seed draws the same masks.
    backbone.masks = []
    again = ComplementaryInfoNCE(seed=0)
    again.views(batch, backbone)
    assert torch.equal(backbone.masks[0], first)


def test_a_fit_with_uniform_complementary_ssl_and_its_hparams_rebuild(tmp_path) -> None:
    torch.manual_seed(0)
    m = module(item_objectives={"cfm": ComplementaryInfoNCE(temperature=0.2)},
               item_weights={"cfm": 0.5}, ssl_items="uniform", ssl_batch_size=16, ssl_seed=7,
               uniform_negatives=8)  # fmt: skip
    train, val = split()
    t = trainer(tmp_path, max_steps=3, val_check_interval=3, num_sanity_val_steps=0)
    t.fit(m, loader(train, 32, True), loader(val, 64, False))
    assert t.global_step == 3 and torch.isfinite(t.callback_metrics["train/cfm/loss"])
    args = {k: v for k, v in m.hparams.items() if not k.startswith("_")}
    again = RetrievalModule(**args)
    assert again.ssl_sampler.source == "uniform" and again.ssl_sampler.size == 16
    again.load_state_dict(m.state_dict())  # the sampler's position travels with the weights
    assert torch.equal(again.ssl_sampler.catalogue_rows(ITEMS, 32)[1],
                       m.ssl_sampler.catalogue_rows(ITEMS, 32)[1])  # fmt: skip


def _tower_state(tower: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        k: v.clone()
        for k, v in tower.state_dict().items()
        if isinstance(v, torch.Tensor) and v.is_floating_point()
    }


def _changed(before: dict[str, torch.Tensor], tower: torch.nn.Module) -> list[str]:
    after = tower.state_dict()
    return [k for k, v in before.items() if not torch.equal(v, after[k])]


def test_item_pretraining_epochs_train_the_item_tower_alone_then_both(tmp_path) -> None:
    torch.manual_seed(0)
    m = module(item_objectives={"cfm": ComplementaryInfoNCE(temperature=0.2)},
               item_pretrain_epochs=1, ssl_batch_size=16)  # fmt: skip
    items = m.pretraining_items(32)
    item_col = m.towers.item_schema.field_names.index("item")
    ids = items.sparse[:, item_col].tolist()
    assert len(ids) == 16 and len(set(ids)) == 16  # distinct catalogue items
    query, item = _tower_state(m.towers.query_tower), _tower_state(m.towers.item_tower)
    train, _ = split()
    t = trainer(tmp_path, max_epochs=1)
    t.fit(m, loader(train, 32, True))
    # the pretraining epoch: no interaction, so the query tower is untouched
    assert not _changed(query, m.towers.query_tower) and _changed(item, m.towers.item_tower)
    assert "train/cfm/loss" in t.callback_metrics and "train/softmax/loss" not in t.callback_metrics
    t = trainer(tmp_path, max_epochs=2)
    t.fit(m, loader(train, 32, True))  # epoch 1 from the start: the softmax trains both towers
    assert _changed(query, m.towers.query_tower) and "train/softmax/loss" in t.callback_metrics


def test_item_pretraining_needs_objectives_and_a_catalogue() -> None:
    with pytest.raises(ValueError, match="item_pretrain_epochs=2 needs item_objectives"):
        module(item_pretrain_epochs=2)
    m = module(item_objectives={"cfm": ComplementaryInfoNCE()}, item_pretrain_epochs=1)
    m.catalogue = None
    with pytest.raises(ValueError, match="pretrains on the item catalogue"):
        m.pretraining_items(8)
