"""Self-supervision as a training signal: CTR + weighted objectives, semi-supervised batches."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.nn.functional as F

from ssl_rec.cli import run as cli_run
from ssl_rec.cli.datamodules import datamodule_from
from ssl_rec.data import BatchLoader, SemiSupervisedLoader, TabularDataModule
from ssl_rec.data.arrow_data_module import labeled_subset
from ssl_rec.data.storage import record_batch, split_schema
from ssl_rec.hardware import TableSpec
from ssl_rec.lightning import CTRModule
from ssl_rec.models import Backbone, DLRMEncoder
from ssl_rec.objectives import (
    AdversarialFeatureReplacement,
    FeatureAlignment,
    FieldUniformity,
    InfoNCE,
    feature_alignment_loss,
    field_uniformity_loss,
)
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch
from ssl_rec.views import CorrelatedFieldMask, FeatureSwap, View

ROOT = Path(__file__).resolve().parents[2]
CARDS = (6, 30, 50)
SEMI = str(ROOT / "configs/finetune/semi_supervised.yaml")


def schema() -> dict:
    fields = tuple(CategoricalField(f"C{i + 1}", c) for i, c in enumerate(CARDS))
    return FeatureSchema(("I1", "I2"), fields, "label").to_dict()


def factory() -> partial:
    encoder = partial(DLRMEncoder, bottom=(8,), top=(16,))
    return partial(Backbone, embedding_dim=8, tables=TableSpec("fp32"), encoder=encoder)


def batch(n: int = 32, unlabeled: int = 0, seed: int = 0) -> Batch:
    """``n`` rows, the last ``unlabeled`` of them labeled NaN."""
    g = torch.Generator().manual_seed(seed)
    sparse = torch.stack([torch.randint(1, c, (n,), generator=g) for c in CARDS], 1)
    label = torch.randint(0, 2, (n,), generator=g).float()
    label[n - unlabeled :] = float("nan")
    return Batch(torch.randn(n, 2, generator=g), sparse, label, torch.arange(n))


def quiet(module: CTRModule) -> CTRModule:
    """The module with logging off (no Trainer is attached in these unit tests)."""
    module.log = lambda *a, **k: None
    module.log_dict = lambda *a, **k: None
    return module


def reseed(module: torch.nn.Module) -> None:
    for part in module.modules():
        if isinstance(part, View):
            part.reseed()


def test_joint_loss_is_bce_plus_weighted_objectives() -> None:
    torch.manual_seed(0)
    view = View(CorrelatedFieldMask(0.3), [FeatureSwap(0.2)], seed=1)
    objectives = {"nce": InfoNCE(view, max_rows=16), "align": FeatureAlignment()}
    module = quiet(CTRModule(factory(), schema(), objectives=objectives,
                             objective_weights={"nce": 0.5, "align": 0.3}))  # fmt: skip
    b = batch()
    with torch.no_grad():
        reseed(module)
        loss = module.training_step(b, 0)
        reseed(module)
        bce = F.binary_cross_entropy_with_logits(module(b), b.label)
        nce = objectives["nce"](b, module.backbone).loss
        align = feature_alignment_loss(module.backbone.embed(b.sparse))
    assert float(nce) > 0 and float(align) > 0
    torch.testing.assert_close(loss, bce + 0.5 * nce + 0.3 * align)


def test_unlabeled_rows_contribute_nothing_to_the_click_loss() -> None:
    module = quiet(CTRModule(factory(), schema(), objectives={"u": FieldUniformity()},
                             objective_weights={"u": 0.0}))  # fmt: skip
    mixed = batch(32, unlabeled=12)
    dense = mixed.dense.clone().requires_grad_(True)
    mixed = Batch(dense, mixed.sparse, mixed.label, mixed.row_id)
    labeled = Batch(dense[:20], mixed.sparse[:20], mixed.label[:20])
    head = list(module.head.parameters())
    # autograd.grad with these inputs never runs the tables' fused update (not on the path)
    loss, n = module.click_loss(mixed)
    grads = torch.autograd.grad(loss, [dense, *head])
    reference, _ = module.click_loss(labeled)
    reference_grads = torch.autograd.grad(reference, head)
    assert n == 20 and torch.isfinite(loss)
    torch.testing.assert_close(loss, reference)
    assert torch.all(grads[0][20:] == 0) and bool(grads[0][:20].abs().sum() > 0)
    for got, want in zip(grads[1:], reference_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_a_batch_without_labels_gives_the_auxiliary_loss_only() -> None:
    module = quiet(CTRModule(factory(), schema(), objectives={"align": FeatureAlignment()},
                             objective_weights={"align": 0.25}))  # fmt: skip
    b = batch(16, unlabeled=16)
    loss = module.training_step(b, 0)
    with torch.no_grad():
        align = feature_alignment_loss(module.backbone.embed(b.sparse))
    assert torch.isfinite(loss) and loss.requires_grad
    torch.testing.assert_close(loss.detach(), 0.25 * align)


def test_unlabeled_rows_need_an_objective() -> None:
    module = quiet(CTRModule(factory(), schema()))
    with pytest.raises(ValueError, match="unlabeled rows need an objective"):
        module.training_step(batch(16, unlabeled=4), 0)
    loss = module.training_step(batch(16), 0)  # labeled batches as before
    assert torch.isfinite(loss)


def test_adversarial_objectives_and_linear_probe_are_refused() -> None:
    with pytest.raises(ValueError, match=r"objectives\['afr'\].*AdversarialFeatureReplacement"):
        CTRModule(factory(), schema(), objectives={"afr": AdversarialFeatureReplacement()})
    with pytest.raises(ValueError, match="frozen backbone"):
        CTRModule(factory(), schema(), objectives={"a": FeatureAlignment()},
                  finetune="linear_probe")  # fmt: skip
    with pytest.raises(ValueError, match=r"objective_weights\['a'\] must be >= 0"):
        CTRModule(factory(), schema(), objectives={"a": FeatureAlignment()},
                  objective_weights={"a": -0.1})  # fmt: skip


def test_cl4ctr_regularizers_follow_their_definitions() -> None:
    tokens = torch.randn(7, 4, 3, generator=torch.Generator().manual_seed(0))
    pairs = [(i, j) for i in range(7) for j in range(i + 1, 7)]
    brute = torch.stack([(tokens[i] - tokens[j]).pow(2).sum(-1) for i, j in pairs]).mean()
    torch.testing.assert_close(feature_alignment_loss(tokens), brute)
    cos = F.cosine_similarity(tokens.unsqueeze(2), tokens.unsqueeze(1), dim=-1)  # [B, F, F]
    off = [(f, g) for f in range(4) for g in range(4) if f != g]
    torch.testing.assert_close(
        field_uniformity_loss(tokens), torch.stack([cos[:, f, g] for f, g in off]).mean()
    )
    same = tokens[:1].expand(5, 4, 3)  # identical rows: aligned; equal fields: not uniform
    assert float(feature_alignment_loss(same)) == pytest.approx(0.0, abs=1e-6)
    assert float(field_uniformity_loss(tokens[:, :1].expand(7, 4, 3))) == pytest.approx(1.0)


def _table(n: int, offset: int = 0) -> pa.Table:
    rows = np.arange(offset, offset + n)
    dense = np.stack([rows, rows], 1).astype(np.float32)
    sparse = np.stack([rows % 5, rows % 7, rows % 3], 1)
    rb = record_batch(split_schema(2, 3, True, False), dense, sparse, np.zeros(n))
    return pa.Table.from_batches([rb])


def _mixed(rank: int = 0, world: int = 2, seed: int = 0) -> SemiSupervisedLoader:
    labeled = BatchLoader(_table(48), 8, shuffle=True, seed=seed, block_rows=16,
                          rank=rank, world_size=world)  # fmt: skip
    return SemiSupervisedLoader(labeled, _table(60, offset=100), np.arange(100, 160), 5)


def _ids(loader: SemiSupervisedLoader, epochs: int = 1) -> list[tuple[list[int], list[int]]]:
    out = []
    for _ in range(epochs):
        for b in loader:
            labeled = torch.isfinite(b.label)
            out.append((b.row_id[labeled].tolist(), b.row_id[~labeled].tolist()))
    return out


def test_semi_supervised_loader_shards_cycles_and_resumes() -> None:
    ranks = [_ids(_mixed(rank), epochs=4) for rank in (0, 1)]
    for batches in ranks:  # every batch: 8 labeled rows first, then 5 unlabeled
        assert all(len(lab) == 8 and len(unl) == 5 for lab, unl in batches)
    # 24 labeled rows per rank: 3 batches per epoch; 30 unlabeled: 6 batches per pool cycle
    first_epoch = [{i for lab, _ in r[:3] for i in lab} for r in ranks]
    assert first_epoch[0].isdisjoint(first_epoch[1]) and len(first_epoch[0] | first_epoch[1]) == 48
    # within one pass over the pool (same on every rank), ranks read disjoint rows
    pools = [{i for _, unl in r[:6] for i in unl} for r in ranks]
    assert pools[0].isdisjoint(pools[1]) and pools[0] | pools[1] == set(range(100, 160))
    assert _ids(_mixed(0), epochs=4) == ranks[0]  # deterministic
    assert _ids(_mixed(0, seed=1), epochs=1) != ranks[0][:3]
    resumed = _mixed(0)
    resumed.load_state_dict({**resumed.state_dict(), "epoch": 2, "batches": 1})
    assert _ids(resumed) == ranks[0][7:9]  # epoch 2 after its first batch
    with pytest.raises(ValueError, match="unlabeled_per_batch"):
        _mixed(0).load_state_dict({**resumed.state_dict(), "unlabeled_batch_size": 4})


def _tabular(path: Path, cache: Path, **kwargs) -> TabularDataModule:
    return TabularDataModule(str(path), "clicked", ["price"], ["user", "item"],
                             cache_dir=str(cache), **kwargs)  # fmt: skip


def test_data_module_mixes_the_rest_of_the_training_rows(tmp_path, write_clicks) -> None:
    write_clicks(tmp_path / "clicks.csv", n=1000)
    options = {"batch_size": 32, "label_fraction": 0.2, "unlabeled_per_batch": 2.0, "seed": 3}
    data = _tabular(tmp_path / "clicks.csv", tmp_path / "cache", **options)
    n = data.split_table("train").num_rows
    labeled = set(labeled_subset(n, 0.2, 3).tolist())
    loader = data.train_dataloader()
    per_epoch, batches = len(loader), _ids(loader, epochs=6)
    assert all(len(unl) == 64 for _, unl in batches)
    epoch = batches[:per_epoch]
    assert [len(lab) for lab, _ in epoch[:-1]] == [32] * (per_epoch - 1)
    assert sorted(i for lab, _ in epoch for i in lab) == sorted(labeled)
    unlabeled = {i for _, unl in batches for i in unl}
    assert unlabeled == set(range(n)) - labeled  # exactly the complement, cycled
    again = _tabular(tmp_path / "clicks.csv", tmp_path / "cache", **options)
    assert _ids(again.train_dataloader(), epochs=6) == batches


def test_labeled_train_dataloader_and_each_fact_logged_once(tmp_path, write_clicks,
                                                          caplog) -> None:  # fmt: skip
    """The labeled rows alone (what the wide term's fit reads), and a second loader built
    from the same data module does not repeat the rows and batch-size lines."""
    write_clicks(tmp_path / "clicks.csv", n=1000)
    options = {"label_fraction": 0.2, "unlabeled_per_batch": 2.0, "seed": 3, "batch_size": "auto"}
    data = _tabular(tmp_path / "clicks.csv", tmp_path / "cache", **options)
    n = data.split_table("train").num_rows
    with caplog.at_level(logging.INFO, logger="ssl_rec.data"):
        mixed = data.train_dataloader()
        labeled = data.labeled_train_dataloader()
    assert isinstance(mixed, SemiSupervisedLoader) and isinstance(labeled, BatchLoader)
    rows = [i for lab, unl in _ids(labeled) for i in lab + unl]
    assert sorted(rows) == sorted(labeled_subset(n, 0.2, 3).tolist())
    assert all(torch.isfinite(b.label).all() for b in labeled)
    said = [r.getMessage() for r in caplog.records]
    for fact in ("training on", "batch_size auto"):
        assert sum(m.startswith(fact) for m in said) == 1, said
    unlabeled = _tabular(tmp_path / "clicks.csv", tmp_path / "cache", use_labels=False)
    with pytest.raises(ValueError, match="use_labels"):
        unlabeled.labeled_train_dataloader()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"label_fraction": 1.0, "unlabeled_per_batch": 1.0}, "label_fraction < 1"),
        ({"label_fraction": 0.5, "unlabeled_per_batch": 1.0, "use_labels": False}, "use_labels"),
        ({"label_fraction": 0.5, "unlabeled_per_batch": -1.0}, "must be >= 0"),
    ],
)
def test_bad_batch_mix_is_refused(tmp_path, kwargs, match) -> None:
    args = {"label": "clicked", **kwargs}
    with pytest.raises(ValueError, match=match):
        TabularDataModule(str(tmp_path / "x.csv"), dense=["price"], **args)


def _fit_args(csv: Path, tmp_path: Path) -> list[str]:
    return ["fit", "--config", SEMI, f"--data.path={csv}", "--data.label=clicked",
            "--data.dense=[price]", "--data.categorical=[user,item]",
            f"--data.cache_dir={tmp_path / 'cache'}", "--data.batch_size=64",
            "--trainer.logger=false", "--trainer.enable_progress_bar=false",
            "--trainer.max_epochs=1"]  # fmt: skip


def test_cli_semi_supervised_fit_then_test(tmp_path, write_clicks) -> None:
    csv = tmp_path / "clicks.csv"
    write_clicks(csv, n=1200)
    root = tmp_path / "run"
    cli = cli_run([*_fit_args(csv, tmp_path), f"--trainer.default_root_dir={root}"])
    assert cli.trainer.state.finished
    assert {"train/ctr_loss", "train/info_nce/alignment"} <= set(cli.trainer.callback_metrics)
    assert isinstance(cli.trainer.train_dataloader, SemiSupervisedLoader)
    ckpt = root / "checkpoints" / "best.ckpt"
    alone = CTRModule.load_from_checkpoint(ckpt)
    assert isinstance(alone.objectives["info_nce"], InfoNCE)
    assert alone.objective_weights == {"info_nce": 0.1}
    tested = cli_run(["test", "--ckpt_path", str(ckpt), "--trainer.logger=false",
                      "--trainer.enable_progress_bar=false"])  # fmt: skip
    assert 0.0 <= tested.trainer.callback_metrics["test/auc"] <= 1.0
    # commands reading a split back from the checkpoint's data get labeled rows only
    recorded = datamodule_from(str(ckpt), None, alone, use_labels=True)
    assert recorded.unlabeled_per_batch == 0 and recorded.label_fraction == 0.1
    assert isinstance(recorded.train_dataloader(), BatchLoader)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--model.objective_weights={info_nce: -1.0}"], ["objective_weights", "info_nce", ">= 0"]),
        (["--model.objective_weights={nope: 1.0}"], ["unknown objectives", "nope"]),
        (["--data.label_fraction=1.0"], ["unlabeled_per_batch", "label_fraction < 1"]),
    ],
    ids=["negative weight", "unknown objective", "mix without unlabeled rows"],
)
def test_cli_bad_joint_settings_exit_2_in_one_line(tmp_path, write_clicks, cli_refuses, extra,
                                                   expected) -> None:  # fmt: skip
    csv = tmp_path / "clicks.csv"
    write_clicks(csv, n=300)
    cli_refuses([*_fit_args(csv, tmp_path), *extra], *expected)
