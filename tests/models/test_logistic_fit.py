"""Logistic regression fitted full-batch, and a Wide & Deep model started from it."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from ssl_rec.lightning import CTRModule, wide_prefit
from ssl_rec.lightning.wide_prefit import WIDE_INVERSE_STRENGTHS, WideFitState
from ssl_rec.metrics import binary_auc
from ssl_rec.models.logistic_fit import fit_logistic
from ssl_rec.quantize.scoring import Rows
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch

CARDINALITIES = (12, 9)


def _rows(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ids and one dense column (large, offset) with labels drawn from a logistic model."""
    g = torch.Generator().manual_seed(seed)
    sparse = torch.stack([torch.randint(0, c, (n,), generator=g) for c in CARDINALITIES], 1)
    dense = 300.0 + 50.0 * torch.randn(n, 1, generator=g)
    effect = torch.linspace(-1.5, 1.5, CARDINALITIES[0])[sparse[:, 0]]
    logit = effect + 0.02 * (dense[:, 0] - 300.0) - 0.3
    label = (torch.rand(n, generator=g) < torch.sigmoid(logit)).float()
    return sparse, dense, label


def _objective_gradient(fit, sparse, dense, label):  # noqa: ANN001, ANN202
    """Gradient of ``C * sum BCE + ||w||^2 / 2`` (dense weights on standardized columns)."""
    c = fit.inverse_strength
    residual = torch.sigmoid(fit.logits(sparse, dense).double()) - label.double()
    grads = []
    for field, weights in enumerate(fit.ids):
        per_id = torch.zeros(len(weights), dtype=torch.float64)
        per_id.index_add_(0, sparse[:, field], residual)
        grads.append(c * per_id + weights.double())
    std = dense.double().std(0, unbiased=False)
    standardized = (dense.double() - dense.double().mean(0)) / std
    grads.append(c * standardized.T @ residual + fit.dense.double() * std)
    grads.append(residual.sum().reshape(1))  # the bias is not penalized
    return torch.cat(grads)


@pytest.mark.parametrize("c", [0.01, 1.0])
def test_fit_logistic_reaches_the_penalized_optimum(c):
    sparse, dense, label = _rows(3000, 0)
    fit = fit_logistic(sparse, dense, label, CARDINALITIES, c)
    gradient = _objective_gradient(fit, sparse, dense, label)
    assert gradient.abs().max() < 1e-3 * max(1.0, c * len(label) ** 0.5)
    # it recovers the generating effects of field 0 (up to the penalty's shrinkage)
    truth = torch.linspace(-1.5, 1.5, CARDINALITIES[0])
    assert torch.corrcoef(torch.stack([fit.ids[0], truth]))[0, 1] > 0.95


def test_a_stronger_penalty_shrinks_the_weights_and_units_do_not_matter():
    sparse, dense, label = _rows(2000, 1)
    weak, strong = (fit_logistic(sparse, dense, label, CARDINALITIES, c) for c in (10.0, 0.01))
    assert strong.ids[0].norm() < 0.5 * weak.ids[0].norm()
    # a dense column in other units gives the same model (the penalty sees standardized values)
    rescaled = fit_logistic(sparse, dense / 1000.0, label, CARDINALITIES, 10.0)
    torch.testing.assert_close(
        rescaled.logits(sparse, dense / 1000.0), weak.logits(sparse, dense), atol=1e-3, rtol=0
    )


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s, d, y: (s[:0], d[:0], y[:0]), "no labeled rows"),
        (lambda s, d, y: (s + 100, d, y), "outside"),
        (lambda s, d, y: (s, d.index_fill(0, torch.tensor([3]), float("nan")), y), "finite"),
        (lambda s, d, y: (s[:, :1], d, y), "disagree"),
    ],
)
def test_fit_logistic_refuses_bad_input(mutate, message):
    sparse, dense, label = mutate(*_rows(50, 2))
    with pytest.raises(ValueError, match=message):
        fit_logistic(sparse, dense, label, CARDINALITIES, 1.0)
    with pytest.raises(ValueError, match="inverse_strength"):
        fit_logistic(*_rows(50, 2), CARDINALITIES, 0.0)


def test_rows_from_batches_skips_unlabeled_rows_and_stops_at_the_cap():
    sparse, dense, label = _rows(10, 3)
    label[[1, 4]] = float("nan")
    batches = [Batch(dense[:5], sparse[:5], label[:5]), Batch(dense[5:], sparse[5:], label[5:])]
    rows = Rows.from_batches(batches, 6, "rows")
    got = rows.sparse, rows.dense, rows.label
    keep = torch.tensor([0, 2, 3, 5, 6, 7])
    for a, b in zip(got, (sparse[keep], dense[keep], label[keep]), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="no rows with a label"):
        Rows.from_batches([Batch(dense[:2], sparse[:2], torch.full((2,), float("nan")))], 10, "")


class _Rows(pl.LightningDataModule):
    def __init__(self, seed: int = 4) -> None:
        super().__init__()
        self.train, self.val = _rows(600, seed), _rows(400, seed + 1)

    @staticmethod
    def _batches(rows, size: int) -> DataLoader:  # noqa: ANN001
        sparse, dense, label = rows
        batches = [Batch(dense[i : i + size], sparse[i : i + size], label[i : i + size])
                   for i in range(0, len(label), size)]  # fmt: skip
        return DataLoader(batches, batch_size=None)

    def train_dataloader(self) -> DataLoader:
        return self._batches(self.train, 100)

    def val_dataloader(self) -> DataLoader:
        return self._batches(self.val, 200)


def _module(**kwargs) -> CTRModule:  # noqa: ANN003
    schema = FeatureSchema(["price"], [CategoricalField("user", 12), CategoricalField("item", 9)],
                           "label")  # fmt: skip
    encoder = {"class_path": "ssl_rec.models.DeepFMEncoder", "init_args": {"deep": [8]}}
    backbone = {"class_path": "ssl_rec.models.Backbone",
                "init_args": {"embedding_dim": 4, "encoder": encoder}}  # fmt: skip
    return CTRModule(backbone, schema.to_dict(), **kwargs)


class _StartLogits(pl.Callback):
    def on_train_start(self, trainer: pl.Trainer, module: CTRModule) -> None:
        sparse, dense, _ = trainer.datamodule.val
        module.eval()
        with torch.no_grad():
            self.logits = module(Batch(dense, sparse))
        self.wide = [w.clone() for w in module.wide.ids.float_weights()]
        module.train()


def _trainer(epochs: int, *callbacks: pl.Callback) -> pl.Trainer:
    return pl.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, callbacks=list(callbacks))  # fmt: skip


def test_wide_init_logistic_starts_at_the_regression_chosen_on_validation_and_holds_it(tmp_path):
    data, start = _Rows(), _StartLogits()
    module = _module(wide=True, wide_init="logistic")
    trainer = _trainer(2, start)
    trainer.fit(module, datamodule=data)
    report = module.provenance["wide_fit"]
    sparse, dense, label = data.train
    v_sparse, v_dense, v_label = data.val
    fits = {c: fit_logistic(sparse, dense, label, CARDINALITIES, c) for c in WIDE_INVERSE_STRENGTHS}
    aucs = {c: binary_auc(f.logits(v_sparse, v_dense), v_label) for c, f in fits.items()}
    chosen = max(aucs, key=aucs.get)
    assert report["inverse_strength"] == chosen and report["rows"] == 600
    assert report["val_auc"] == pytest.approx({f"{c:g}": a for c, a in aucs.items()})
    # training starts at that regression's logits: the deep part's output starts at zero
    torch.testing.assert_close(start.logits, fits[chosen].logits(v_sparse, v_dense), atol=1e-4,
                               rtol=0)  # fmt: skip
    # the deep part trained, the wide term did not
    assert module.head.output.weight.abs().sum() > 0
    for before, after in zip(start.wide, module.wide.ids.float_weights(), strict=True):
        assert torch.equal(before, after)
    assert torch.equal(module.wide.dense.weight.reshape(-1), fits[chosen].dense)

    # the checkpoint says the fit is done: a resumed run (on other rows, where a refit would
    # give other weights) keeps the wide term it trained with
    path = tmp_path / "wide.ckpt"
    trainer.save_checkpoint(path)
    loaded = CTRModule.load_from_checkpoint(path)
    assert int(loaded.wide_fit_state) == WideFitState.fitted
    assert loaded.provenance["wide_fit"] == report
    _trainer(3).fit(loaded, datamodule=_Rows(seed=40), ckpt_path=path)
    assert loaded.current_epoch == 3
    for before, after in zip(start.wide, loaded.wide.ids.float_weights(), strict=True):
        assert torch.equal(before, after)
    refit = _module(wide=True, wide_init="logistic")
    _trainer(1).fit(refit, datamodule=_Rows(seed=40))
    assert not torch.equal(refit.wide.ids.float_weights()[0], start.wide[0])


def test_wide_init_auto_fits_on_few_rows_and_trains_from_zero_on_many(monkeypatch):
    few = _module(wide=True, wide_init="auto")
    _trainer(1).fit(few, datamodule=_Rows())
    assert int(few.wide_fit_state) == WideFitState.fitted and few.wide.ids.frozen
    monkeypatch.setattr(wide_prefit, "WIDE_AUTO_MAX_ROWS", 599)  # the data has 600
    many = _module(wide=True, wide_init="auto")
    _trainer(1).fit(many, datamodule=_Rows())
    assert int(many.wide_fit_state) == WideFitState.trained and "wide_fit" not in many.provenance
    assert not many.wide.ids.frozen and many.wide.dense.weight.abs().sum() > 0  # it trained
    # without a wide term, auto does nothing
    plain = _module(wide_init="auto")
    _trainer(1).fit(plain, datamodule=_Rows())
    assert plain.wide is None and not hasattr(plain, "wide_fit_state")


def test_wide_auto_start_reason_weighs_rows_per_id_and_caps_the_ids():
    reason = wide_prefit.wide_auto_start_reason
    assert reason(20_000, 10) is None and reason(40_000, 4_000) is None  # 10 per id
    assert reason(40_001, 4_000) == (
        "40,001 labeled rows, more than 20,000 and than 10 per id of the fields' 4,000 ids"
    )
    capped = "2,000,001 ids, more than the 2,000,000 a regression start fits"
    assert reason(100, 2_000_001) == capped


class _SizedRows(_Rows):
    """A training loader that says how many rows it holds, as the library's loaders do."""

    def train_dataloader(self) -> DataLoader:
        loader = super().train_dataloader()
        loader.num_rows = len(self.train[2])
        return loader


def test_wide_init_auto_fits_where_each_id_has_few_labeled_rows(monkeypatch, caplog):
    monkeypatch.setattr(wide_prefit, "WIDE_AUTO_MAX_ROWS", 599)  # 600 rows of 21 ids: 28.6 each
    monkeypatch.setattr(wide_prefit, "WIDE_AUTO_ROWS_PER_ID", 29)
    sparse = _module(wide=True, wide_init="auto")
    _trainer(1).fit(sparse, datamodule=_SizedRows())
    assert int(sparse.wide_fit_state) == WideFitState.fitted and sparse.wide.ids.frozen
    monkeypatch.setattr(wide_prefit, "WIDE_AUTO_ROWS_PER_ID", 28)
    dense = _module(wide=True, wide_init="auto")
    with caplog.at_level(logging.INFO):
        _trainer(1).fit(dense, datamodule=_SizedRows())
    assert int(dense.wide_fit_state) == WideFitState.trained and not dense.wide.ids.frozen
    assert "600 labeled rows, more than 599 and than 28 per id of the fields' 21 ids" in (
        caplog.text
    )


class _CountedReads(_Rows):
    """A training loader without ``num_rows`` that counts how often it is read."""

    reads = 0

    def train_dataloader(self) -> DataLoader:
        loader = super().train_dataloader()
        parent = self

        class Counted(DataLoader):
            def __iter__(self):  # noqa: ANN204
                parent.reads += 1
                return super().__iter__()

        return Counted(loader.dataset, batch_size=None)


def test_wide_init_auto_reads_a_loader_of_unknown_size_once():
    module = _module(wide=True, wide_init="auto")
    data = _CountedReads()
    host = SimpleNamespace(trainer=SimpleNamespace(world_size=1, datamodule=data),
                           head=module.head, schema=module.schema, provenance={})  # fmt: skip
    wide_prefit.start_wide_term(host, module.wide, module.wide_fit_state, "auto")
    assert int(module.wide_fit_state) == WideFitState.fitted
    assert data.reads == 1 and host.provenance["wide_fit"]["rows"] == 600


def test_wide_init_refuses_a_model_without_a_wide_term_and_unknown_values():
    with pytest.raises(ValueError, match="set wide=true"):
        _module(wide_init="logistic")
    with pytest.raises(ValueError, match="wide_init must be"):
        _module(wide=True, wide_init="lbfgs")
    assert not hasattr(_module(wide=True), "wide_fit_state")  # the former state-dict keys


def test_wide_start_under_several_processes_or_without_data_module():
    """``auto`` trains from zero under several processes; ``logistic`` says why it cannot."""
    module = _module(wide=True, wide_init="auto")
    several = SimpleNamespace(trainer=SimpleNamespace(world_size=2, datamodule=_Rows()))
    wide_prefit.start_wide_term(several, module.wide, module.wide_fit_state, "auto")
    assert int(module.wide_fit_state) == WideFitState.trained and not module.wide.ids.frozen
    state = torch.tensor(WideFitState.pending)
    with pytest.raises(ValueError, match="one process"):
        wide_prefit.start_wide_term(several, module.wide, state, "logistic")
    alone = SimpleNamespace(trainer=SimpleNamespace(world_size=1, datamodule=None))
    with pytest.raises(ValueError, match="needs a data module"):
        wide_prefit.start_wide_term(alone, module.wide, state, "logistic")
    assert int(state) == WideFitState.pending
