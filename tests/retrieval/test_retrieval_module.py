"""RetrievalModule: a short fit with item-side InfoNCE and uniform negatives, and learning."""

from __future__ import annotations

import warnings
from functools import partial

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from ssl_rec.evaluation import ItemCatalogue, Retriever, tail_items
from ssl_rec.lightning import RetrievalModule
from ssl_rec.models import TowerEncoder, TwoTowerModel
from ssl_rec.objectives import InfoNCE, SampledSoftmax
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch

USERS, ITEMS, CLUSTERS = 24, 36, 3
SCHEMA = FeatureSchema(
    ("age",),
    (CategoricalField("user", USERS + 1), CategoricalField("item", ITEMS + 1),
     CategoricalField("genre", CLUSTERS + 1)),
    "label",
)  # fmt: skip


def rows(pairs: list[tuple[int, int]]) -> Batch:
    """Full-schema rows of ``(user, item)`` pairs; an item's genre is its cluster."""
    t = torch.tensor(pairs)
    genre = t[:, 1] % CLUSTERS + 1
    return Batch(t[:, :1].float() / USERS, torch.stack([t[:, 0], t[:, 1], genre], 1))


def split() -> tuple[list, list]:
    """Each user likes the items of its cluster: 8 of them in training, 1 held out."""
    g = torch.Generator().manual_seed(0)
    train, val = [], []
    for user in range(1, USERS + 1):
        liked = [i for i in range(1, ITEMS + 1) if i % CLUSTERS == user % CLUSTERS]
        order = torch.randperm(len(liked), generator=g).tolist()
        train += [(user, liked[j]) for j in order[:8]]
        val.append((user, liked[order[8]]))
    return train, val


def loader(pairs: list, batch_size: int, shuffle: bool) -> DataLoader:
    return DataLoader(pairs, batch_size=batch_size, shuffle=shuffle, collate_fn=rows)


def module(**kwargs) -> RetrievalModule:
    encoder = partial(TowerEncoder, hidden=[32], output_dim=16)
    towers = partial(TwoTowerModel, query_fields=["user", "age"],
                     item_fields=["item", "genre"], embedding_dim=8,
                     query_encoder=encoder, item_encoder=encoder)  # fmt: skip
    m = RetrievalModule(towers, SCHEMA.to_dict(), learning_rate=1e-2, **kwargs)
    train, _ = split()
    items = rows([(0, i) for i in range(1, ITEMS + 1)])
    counts = torch.bincount(torch.tensor([i for _, i in train]), minlength=ITEMS + 1)[1:]
    m.set_catalogue(ItemCatalogue(
        m.towers.item_batch(items), torch.arange(1, ITEMS + 1), torch.tensor(train),
        tail_items(counts, 0.8),
    ))  # fmt: skip
    return m


def trainer(tmp_path, **kwargs) -> pl.Trainer:
    warnings.filterwarnings("ignore", ".*treespec, LeafSpec.*")
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*no `val_dataloader`.*")
    quiet = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                 enable_model_summary=False)  # fmt: skip
    return pl.Trainer(default_root_dir=tmp_path, accelerator="cpu", **{**quiet, **kwargs})


def test_two_step_fit_with_item_infonce_and_uniform_negatives(tmp_path) -> None:
    torch.manual_seed(0)
    m = module(item_objectives={"cfm": InfoNCE(projection_dim=8, hidden=16)},
               item_weights={"cfm": 0.5}, uniform_negatives=8)  # fmt: skip
    train, val = split()
    t = trainer(tmp_path, max_steps=2, val_check_interval=2, num_sanity_val_steps=0)
    t.fit(m, loader(train, 32, True), loader(val, 64, False))
    got = t.callback_metrics
    assert t.global_step == 2
    for key in ("train/loss", "train/softmax/loss", "train/cfm/loss", "val/softmax/loss"):
        assert torch.isfinite(got[key]), key
    assert 0.0 <= float(got["val/recall@10"]) <= 1.0 and 0.0 <= float(got["val/ndcg@10"]) <= 1.0
    assert "val/tail_recall@10" in got
    assert m.frequency is not None and float(m.frequency.step) == 2
    # The trained towers export; the loaded query tower ranks the whole catalogue.
    scores, ids = Retriever.load(m.export(str(tmp_path / "export"))).topk_ids(rows(val[:3]), 10)
    assert scores.shape == ids.shape == (3, 10) and bool((scores[:, :-1] >= scores[:, 1:]).all())
    assert set(ids.flatten().tolist()) <= set(range(1, ITEMS + 1))


def test_training_learns_the_clusters(tmp_path) -> None:
    torch.manual_seed(0)
    m = module()
    train, val = split()
    before = trainer(tmp_path).validate(m, loader(val, 64, False), verbose=False)[0]
    trainer(tmp_path, max_epochs=20, num_sanity_val_steps=0).fit(m, loader(train, 32, True))
    after = trainer(tmp_path).validate(m, loader(val, 64, False), verbose=False)[0]
    # 4 unseen items share the user's cluster: a learned ranking puts them in the top 10.
    assert after["val/recall@10"] == 1.0 > before["val/recall@10"]
    assert after["val/ndcg@10"] > before["val/ndcg@10"]


def test_the_recorded_hyperparameters_rebuild_the_module() -> None:
    m = module(loss=SampledSoftmax(temperature=0.2),
               item_objectives={"cfm": InfoNCE(projection_dim=8, hidden=16)})  # fmt: skip
    args = {k: v for k, v in m.hparams.items() if not k.startswith("_")}
    assert isinstance(args["loss"], dict) and isinstance(args["towers"], dict)
    again = RetrievalModule(**args)  # what load_from_checkpoint does
    assert isinstance(again.loss, SampledSoftmax) and again.loss.temperature == 0.2
    assert isinstance(again.item_objectives["cfm"], InfoNCE)
    assert again.towers.output_dim == 16
    again.load_state_dict(m.state_dict())


def test_bad_arguments_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"RetrievalModule\.log_q='bogus'"):
        module(log_q="bogus")
    with pytest.raises(ValueError, match=r"item_weights names unknown objectives \['x'\]"):
        module(item_weights={"x": 1.0})
    with pytest.raises(ValueError, match=r"user_field='genre'"):
        module(user_field="genre")
