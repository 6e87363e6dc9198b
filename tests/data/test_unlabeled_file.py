"""A separate file of unlabeled rows (``unlabeled_path``): semi-supervised mix and pretraining."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from ssl_rec.cli import main
from ssl_rec.data import PreprocessOptions, TabularDataModule
from ssl_rec.lightning import CTRModule
from ssl_rec.models import Backbone
from ssl_rec.objectives import MaskedFeaturePrediction

OPTIONS = PreprocessOptions(val_fraction=0.1, test_fraction=0.1)


def _write(path: Path, n: int, users: range, seed: int, label: bool = True) -> None:
    """``[clicked,]price,user,item`` rows; ``price`` is ``100 + user`` so rows can be told apart."""
    rng = np.random.default_rng(seed)
    lines = [("clicked," if label else "") + "price,user,item"]
    for _ in range(n):
        user = int(rng.choice(users))
        first = f"{int(rng.random() < 0.5)}," if label else ""
        lines.append(f"{first}{100 + user},u{user},i{rng.integers(0, 5)}")
    path.write_text("\n".join(lines) + "\n")


def _data(tmp_path: Path, **kwargs) -> TabularDataModule:
    return TabularDataModule(
        str(tmp_path / "clicks.csv"), label="clicked", dense=["price"],
        categorical=["user", "item"], preprocess=OPTIONS, batch_size=32,
        cache_dir=str(tmp_path / "cache"), **kwargs,
    )  # fmt: skip


@pytest.fixture
def files(tmp_path: Path) -> Path:
    _write(tmp_path / "clicks.csv", 300, range(0, 10), seed=0)
    _write(tmp_path / "more.csv", 120, range(5, 15), seed=1, label=False)  # u10..u14 unseen
    return tmp_path


def _raw_users(batch) -> np.ndarray:
    """The raw user number of each row, read back from its dense ``log1p(100 + user)``."""
    return np.rint(np.expm1(batch.dense[:, 0].numpy().astype(np.float64)) - 100).astype(int)


def test_the_file_feeds_the_semi_supervised_mix_with_the_training_vocabulary(files) -> None:
    plain = _data(files)
    data = _data(files, unlabeled_per_batch=1.0, unlabeled_path=str(files / "more.csv"))
    assert data.schema.cardinalities == plain.schema.cardinalities  # never refit on the file
    assert data.data_dir == plain.data_dir  # ... nor a part of the labeled entry
    n_train = data.split_table("train").num_rows
    loader = data.train_dataloader()  # label_fraction 1: the file alone is the pool
    assert loader.unlabeled.num_rows == 120
    batch = next(iter(loader))
    unlabeled = batch.label.isnan()
    assert int(unlabeled.sum()) == 32 and int((~unlabeled).sum()) == 32
    assert (batch.row_id[unlabeled] >= n_train).all()  # file rows continue the split's ids
    users, ids = _raw_users(batch)[unlabeled.numpy()], batch.sparse[unlabeled, 0]
    values = data.vocabulary["user"].id_values().to_pylist()  # id -> raw value
    for user, got in zip(users, ids.tolist(), strict=True):
        want = 0 if user >= 10 else values.index(f"u{user}")
        assert got == want, (user, got, want)
    assert (ids == 0).any() and (ids > 0).any()


def test_with_a_label_fraction_the_pool_is_the_rest_plus_the_file(files) -> None:
    data = _data(files, label_fraction=0.25, unlabeled_per_batch=2.0,
                 unlabeled_path=str(files / "more.csv"))  # fmt: skip
    n_train = data.split_table("train").num_rows
    labeled = round(0.25 * n_train)
    assert data.train_dataloader().unlabeled.num_rows == n_train - labeled + 120


def test_pretraining_without_labels_reads_the_training_rows_and_the_file(files) -> None:
    data = TabularDataModule(
        str(files / "clicks.csv"), label="clicked", dense=["price"], categorical=["user", "item"],
        preprocess=OPTIONS, batch_size=50, use_labels=False, cache_dir=str(files / "cache"),
        unlabeled_path=str(files / "more.csv"),
    )  # fmt: skip
    batches = list(data.train_dataloader())
    assert all(b.label is None for b in batches)
    assert sum(b.batch_size for b in batches) == data.split_table("train").num_rows + 120
    users = np.concatenate([_raw_users(b) for b in batches])
    assert (users >= 10).sum() > 0  # rows only the file has


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "unlabeled_path not found"),
        ("price,user\n1,u1\n", r"unknown columns \['item'\]"),
        ("clicked,price,user,item\n1,1,u1,i1\n", "has the label column 'clicked'"),
    ],
)
def test_a_bad_file_is_refused_naming_it(files, content, message) -> None:
    bad = files / "bad.csv"
    if content is not None:
        bad.write_text(content)
    data = _data(files, unlabeled_per_batch=1.0, unlabeled_path=str(bad))
    with pytest.raises((ValueError, FileNotFoundError), match=message) as info:
        data.train_dataloader()
    assert "bad.csv" in str(info.value)


def test_options_that_cannot_use_the_file_are_refused(files) -> None:
    with pytest.raises(ValueError, match="use_labels=true"):
        TabularDataModule(str(files / "clicks.csv"), "clicked", ["price"], ["user"],
                          use_labels=False, unlabeled_per_batch=1.0,
                          unlabeled_path=str(files / "more.csv"))  # fmt: skip
    with pytest.raises(ValueError, match="label_fraction < 1"):  # no file: the rest is needed
        TabularDataModule(str(files / "clicks.csv"), "clicked", ["price"], ["user"],
                          unlabeled_per_batch=1.0)  # fmt: skip


def test_the_command_line_reports_a_bad_unlabeled_file_in_one_line(files, capsys) -> None:
    (files / "labeled.csv").write_text("clicked,price,user,item\n1,1,u1,i1\n")
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", "configs/ctr/tabular.yaml",
              "--data.path", str(files / "clicks.csv"), "--data.label", "clicked",
              "--data.dense", "[price]", "--data.categorical", "[user,item]",
              "--data.batch_size", "64", "--data.unlabeled_per_batch", "1",
              "--data.unlabeled_path", str(files / "labeled.csv"),
              "--trainer.max_epochs", "1", "--trainer.logger=false",
              "--trainer.enable_progress_bar=false",
              "--trainer.default_root_dir", str(files / "run")])  # fmt: skip
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "has the label column 'clicked'" in err.strip().splitlines()[-1]


def test_a_semi_supervised_fit_trains_on_the_file(files) -> None:
    data = _data(files, unlabeled_per_batch=1.0, unlabeled_path=str(files / "more.csv"))
    backbone = partial(Backbone, embedding_dim=4, dense_encoding="quantile_tokens")
    module = CTRModule(backbone, data.schema.to_dict(),
                       objectives={"mfp": MaskedFeaturePrediction(hidden=16)})  # fmt: skip
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False,
                         num_sanity_val_steps=0, default_root_dir=files / "fit")  # fmt: skip
    before = [p.detach().clone() for p in module.head.parameters()]
    trainer.fit(module, datamodule=data)
    after = list(module.head.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
    assert all(p.isfinite().all() for p in after)  # the NaN labels never reach the loss
