"""Dense columns standardized with statistics fitted on the training split and kept in the model."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import pytorch_lightning as pl
import torch

from ssl_rec.cli import main
from ssl_rec.data import PreprocessOptions, TabularDataModule
from ssl_rec.hardware import TableSpec
from ssl_rec.lightning import CTRModule
from ssl_rec.lightning.checkpoint_checksums import CHECKSUMS_KEY, record_checksums
from ssl_rec.lightning.checkpoint_loading import load_module, read_checkpoint, read_vocabulary
from ssl_rec.models import Backbone, DenseStandardizer, tower_schema
from ssl_rec.objectives.masked_dense_reconstruction import MaskedDenseReconstruction
from ssl_rec.quantize import load_quantized
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch
from ssl_rec.vocab import DENSE_STATISTICS_KEY, DenseStatistics

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false"]
COLUMNS = ["--data.label", "clicked", "--data.dense", "[price,views]",
           "--data.categorical", "[user,item]"]  # fmt: skip
MEAN, STD = "backbone.dense_encoding.mean", "backbone.dense_encoding.std"


def _write(path: Path, n: int, seed: int, price_scale: float = 3.0, missing: int = 0) -> None:
    """``clicked,price,views,user,item``: ``views`` spans 0 to 1e9 (log1p: 0 to ~21)."""
    rng = np.random.default_rng(seed)
    user, item = rng.integers(0, 30, n), rng.integers(0, 20, n)
    price = rng.gamma(2.0, price_scale, n).round(2)
    views = np.where(rng.random(n) < 0.5, 0, 10.0 ** rng.uniform(0, 9, n)).round()
    p = 1 / (1 + np.exp(-(np.where(user % 2 == 0, 1.0, -1.0) - 0.05 * price)))
    clicked = (rng.random(n) < p).astype(int)
    lines = ["clicked,price,views,user,item"]
    for i in range(n):
        cell = "" if i < missing else f"{price[i]}"
        lines.append(f"{clicked[i]},{cell},{int(views[i])},u{user[i]},i{item[i]}")
    path.write_text("\n".join(lines) + "\n")


def _data(path: Path, cache: Path, **options) -> TabularDataModule:
    return TabularDataModule(
        str(path), label="clicked", dense=["price", "views"], categorical=["user", "item"],
        batch_size=128, cache_dir=str(cache), preprocess=PreprocessOptions(**options),
    )  # fmt: skip


def _dense(data: TabularDataModule, split: str) -> np.ndarray:
    column = data.split_table(split).column("dense").combine_chunks()
    return column.flatten().to_numpy().reshape(-1, 2).astype(np.float64)


def test_statistics_are_fitted_on_the_training_split_only(tmp_path) -> None:
    folder = tmp_path / "splits"
    folder.mkdir()
    _write(folder / "train.csv", 600, seed=0, price_scale=1.0)
    _write(folder / "valid.csv", 200, seed=1, price_scale=500.0)  # far larger prices
    _write(folder / "test.csv", 200, seed=2, price_scale=500.0)
    data = _data(folder, tmp_path / "cache")
    stats = data.dense_statistics
    train, val = _dense(data, "train"), _dense(data, "val")
    assert stats is not None and stats.columns == ("price", "views") and stats.rows == 600
    np.testing.assert_allclose(stats.mean, train.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats.std, train.std(0), rtol=1e-5)
    assert val[:, 0].mean() > stats.mean[0] + 3  # the validation prices did not leak in
    np.testing.assert_allclose(stats.quantile_edges[:, 0], train.min(0), rtol=1e-6)
    np.testing.assert_allclose(stats.quantile_edges[:, -1], train.max(0), rtol=1e-6)
    assert np.all(np.diff(stats.quantile_edges, axis=1) >= 0)
    # stored in the cache entry: a second data module reads them back without refitting
    again = _data(folder, tmp_path / "cache").dense_statistics
    np.testing.assert_array_equal(again.mean, stats.mean)
    assert data.schema.metadata[DENSE_STATISTICS_KEY]["rows"] == 600


def test_a_wide_column_is_standardized_to_unit_variance(tmp_path) -> None:
    _write(tmp_path / "clicks.csv", 1500, seed=0)
    data = _data(tmp_path / "clicks.csv", tmp_path / "cache")
    raw = torch.from_numpy(_dense(data, "train")).float()
    assert raw[:, 1].std() > 10 * raw[:, 0].std() / 2  # views spans far more than price
    backbone = Backbone(data.schema, embedding_dim=8)
    assert backbone.dense_statistics_set
    standardized = backbone.standardize_dense(raw)
    torch.testing.assert_close(standardized.mean(0), torch.zeros(2), atol=1e-4, rtol=0)
    torch.testing.assert_close(standardized.std(0, correction=0), torch.ones(2), atol=1e-4,
                               rtol=0)  # fmt: skip
    torch.testing.assert_close(backbone.unstandardize_dense(standardized), raw, atol=1e-4,
                               rtol=1e-5)  # fmt: skip
    # The masked reconstruction's targets are standardized: predicting the mean costs ~1
    # per column instead of the wide column's variance.
    objective = MaskedDenseReconstruction(mask_rate=0.5)
    objective.setup(backbone)
    ids = data.split_table("train").column("sparse").combine_chunks().flatten().to_numpy()
    sparse = torch.from_numpy(ids.astype(np.int64)).reshape(-1, 2)
    out = objective(Batch(raw, sparse), backbone)
    assert 0.5 < float(out.logs["mse_of_zero"]) < 2.0
    plain = Backbone(data.schema, embedding_dim=8, dense_encoding="none")
    objective.setup(plain)
    assert float(objective(Batch(raw, sparse), plain).logs["mse_of_zero"]) > 20.0


def test_missing_dense_cells_are_zero_and_non_finite_ones_refused(tmp_path) -> None:
    _write(tmp_path / "clicks.csv", 400, seed=0, missing=100)
    data = _data(tmp_path / "clicks.csv", tmp_path / "cache", val_fraction=0.0,
                 test_fraction=0.0)  # fmt: skip
    train = _dense(data, "train")
    assert (train[:100, 0] == 0).all() and (train[100:, 0] > 0).mean() > 0.9
    stats = data.dense_statistics
    np.testing.assert_allclose(stats.mean, train.mean(0), rtol=1e-6)  # zeros counted
    z = Backbone(data.schema, embedding_dim=8).standardize_dense(torch.from_numpy(train).float())
    assert torch.isfinite(z).all()
    lines = (tmp_path / "clicks.csv").read_text().splitlines()
    lines[5] = "1,nan,3,u1,i1"
    (tmp_path / "nan.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="must be finite"):
        _data(tmp_path / "nan.csv", tmp_path / "cache").schema  # noqa: B018


def test_statistics_without_dense_columns_or_training_rows_are_none(tmp_path) -> None:
    _write(tmp_path / "clicks.csv", 200, seed=0)
    data = _data(tmp_path / "clicks.csv", tmp_path / "cache", val_fraction=0.0,
                 test_fraction=1.0)  # fmt: skip
    data.use_vocabulary(_data(tmp_path / "clicks.csv", tmp_path / "cache").vocabulary)
    assert data.dense_statistics is None
    backbone = Backbone(data.schema, embedding_dim=8)
    assert not backbone.dense_statistics_set
    x = torch.randn(4, 2)
    torch.testing.assert_close(backbone.standardize_dense(x), x)


def test_statistics_of_other_columns_are_refused() -> None:
    schema = FeatureSchema(["price"], [CategoricalField("C1", 5)], "label")
    stats = DenseStatistics(("age",), np.zeros(1), np.ones(1), np.zeros((1, 3)), 10)
    with pytest.raises(ValueError, match=r"describe columns \['age'\], not \['price'\]"):
        Backbone(schema, embedding_dim=4).set_dense_statistics(stats)
    wider = DenseStatistics(("age", "price"), np.array([1.0, 5.0]), np.array([1.0, 2.0]),
                            np.zeros((2, 3)), 10)  # fmt: skip
    tower = Backbone(schema, embedding_dim=4)
    tower.set_dense_statistics(wider)  # a tower of some of the data's columns: by name
    torch.testing.assert_close(tower.standardize_dense(torch.tensor([[7.0]])), torch.ones(1, 1))
    data = FeatureSchema(["age", "price"], [CategoricalField("C1", 5)], "label",
                         {DENSE_STATISTICS_KEY: wider.to_dict()})  # fmt: skip
    query = Backbone(tower_schema(data, ["price", "C1"], "query"), embedding_dim=4)
    torch.testing.assert_close(query.standardize_dense(torch.tensor([[7.0]])), torch.ones(1, 1))
    with pytest.raises(ValueError, match="dense_encoding"):
        Backbone(schema, embedding_dim=4, dense_encoding="log")
    back = DenseStatistics.from_dict(stats.to_dict())
    assert back.columns == ("age",) and back.bins == 2
    with pytest.raises(ValueError, match="not dense statistics"):
        DenseStatistics.from_dict({"format": 1, "columns": ["a"], "mean": [0.0]})


def _old_style(state: dict) -> dict:
    return {k: v for k, v in state.items() if ".dense_encoding." not in k
            and not k.startswith("dense_encoding.")}  # fmt: skip


def test_an_old_state_dict_without_statistics_loads_as_none(tmp_path) -> None:
    _write(tmp_path / "clicks.csv", 600, seed=0)
    schema = _data(tmp_path / "clicks.csv", tmp_path / "cache").schema
    trained = Backbone(schema, embedding_dim=8, dense_encoding="none")
    old = _old_style(trained.state_dict())
    batch = Batch(torch.rand(16, 2) * 20, torch.randint(0, 5, (16, 2)))
    expected = trained.eval()(batch).pooled
    for target in ("fp32", "int8"):  # same table format, and the converting path
        fresh = Backbone(schema, embedding_dim=8, tables=TableSpec(target))
        assert fresh.dense_statistics_set  # from the data: a new model standardizes
        fresh.load_weights(old)
        assert fresh.dense_statistics_set  # ... the loaded one keeps what it was trained on
        torch.testing.assert_close(fresh.standardize_dense(batch.dense), batch.dense)
        if target == "fp32":
            torch.testing.assert_close(fresh.eval()(batch).pooled, expected)
    strict = Backbone(schema, embedding_dim=8)
    strict.load_state_dict(old)  # plain strict load (Lightning's) too
    torch.testing.assert_close(strict.standardize_dense(batch.dense), batch.dense)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    root = tmp_path_factory.mktemp("numeric")
    _write(root / "clicks.csv", 1500, seed=0)
    # DLRM, the backbone the fine-tuning test below builds (the config ships DeepFM)
    main(["fit", "--config", "configs/ctr/tabular.yaml", "--data.path", str(root / "clicks.csv"),
          "--model.init_args.backbone", "configs/common/backbone/dlrm.yaml",
          *COLUMNS, "--data.batch_size", "256", "--trainer.max_epochs", "1",
          "--trainer.default_root_dir", str(root / "run"), *QUIET])  # fmt: skip
    return root, root / "run" / "checkpoints" / "last.ckpt"


def test_the_checkpoint_carries_the_statistics_and_predict_uses_them(fitted) -> None:
    root, ckpt = fitted
    stats = _data(root / "clicks.csv", root / "cache-check").dense_statistics
    state = read_checkpoint(ckpt)["state_dict"]
    np.testing.assert_allclose(state[MEAN].numpy(), stats.mean, rtol=1e-5)
    np.testing.assert_allclose(state[STD].numpy(), stats.std, rtol=1e-5)
    # A new file of much larger prices: its own statistics would differ.
    _write(root / "new.csv", 300, seed=5, price_scale=40.0)
    out = root / "predictions.parquet"
    main(["predict", "--ckpt_path", str(ckpt), "--data.path", str(root / "new.csv"),
          "--predictions.out", str(out), "--trainer.default_root_dir", str(root / "predict"),
          *QUIET])  # fmt: skip
    got = pq.read_table(out).column("probability").to_numpy()
    module = load_module(ckpt).eval()
    new = _data(root / "new.csv", root / "cache-new", val_fraction=0.0, test_fraction=1.0)
    new.use_vocabulary(read_vocabulary(ckpt))
    with torch.no_grad():
        want = torch.cat([torch.sigmoid(module(b)) for b in new.predict_dataloader()]).numpy()
        np.testing.assert_allclose(got, want, atol=1e-5)
        own = _data(root / "new.csv", root / "cache-own").dense_statistics
        assert own.mean[0] > stats.mean[0] + 1
        module.backbone.set_dense_statistics(own)
        other = torch.cat([torch.sigmoid(module(b)) for b in new.predict_dataloader()]).numpy()
    assert np.abs(other - got).max() > 1e-3  # the statistics matter, and were the training's


def test_init_from_keeps_the_pretrained_statistics(fitted) -> None:
    root, ckpt = fitted
    _write(root / "other.csv", 600, seed=7, price_scale=40.0)
    data = _data(root / "other.csv", root / "cache-other")
    data.use_vocabulary(read_vocabulary(ckpt))
    own = data.dense_statistics
    saved = read_checkpoint(ckpt)["state_dict"]
    module = CTRModule(partial(Backbone, embedding_dim=16), data.schema.to_dict(),
                       init_from=str(ckpt))  # fmt: skip
    mean = module.backbone.dense_encoding.mean
    torch.testing.assert_close(mean, saved[MEAN])
    assert abs(float(mean[0]) - own.mean[0]) > 1  # not the fine-tuning data's
    trainer = pl.Trainer(max_steps=1, logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False,
                         num_sanity_val_steps=0, default_root_dir=root / "ft")  # fmt: skip
    trainer.fit(module, datamodule=data)
    torch.testing.assert_close(module.backbone.dense_encoding.mean, saved[MEAN])


def test_an_old_checkpoint_without_statistics_loads_and_predicts_as_none(fitted) -> None:
    root, ckpt = fitted
    checkpoint = read_checkpoint(ckpt)
    checkpoint["state_dict"] = _old_style(checkpoint["state_dict"])
    for schema in (checkpoint.get("feature_schema"), checkpoint["hyper_parameters"].get("schema")):
        if isinstance(schema, dict):
            schema.get("metadata", {}).pop(DENSE_STATISTICS_KEY, None)
    checkpoint.pop(CHECKSUMS_KEY, None)
    record_checksums(checkpoint)
    old = root / "old.ckpt"
    torch.save(checkpoint, old)
    module = load_module(old).eval()
    dense = torch.rand(8, 2) * 10
    torch.testing.assert_close(module.backbone.standardize_dense(dense), dense)
    out = root / "old.parquet"
    main(["predict", "--ckpt_path", str(old), "--data.path", str(root / "clicks.csv"),
          "--predictions.out", str(out), "--trainer.default_root_dir", str(root / "old-run"),
          *QUIET])  # fmt: skip
    assert pq.read_table(out).num_rows == 1500


def test_a_standardizer_alone_round_trips_through_its_state_dict() -> None:
    stats = DenseStatistics(("a", "b"), np.array([1.0, 100.0]), np.array([2.0, 0.0]),
                            np.zeros((2, 5)), 10)  # fmt: skip
    first = DenseStandardizer(2)
    first.set_statistics(stats)
    torch.testing.assert_close(first.std, torch.tensor([2.0, 1.0]))  # constant column: 1
    second = DenseStandardizer(2)
    second.load_state_dict(first.state_dict())
    x = torch.tensor([[3.0, 100.0]])
    torch.testing.assert_close(second(x), torch.tensor([[1.0, 0.0]]))
    none = DenseStandardizer(2, "none")
    none.set_statistics(stats)
    torch.testing.assert_close(none(x), x)


def test_a_quantized_model_standardizes_with_the_training_statistics(fitted) -> None:
    root, ckpt = fitted
    out = root / "quantized"
    main(["quantize", "--ckpt_path", str(ckpt), "--out", str(out), "--budget_ne", "0.001"])
    model = load_quantized(out)
    saved = read_checkpoint(ckpt)["state_dict"]
    torch.testing.assert_close(model.dense.dense_encoding.mean, saved[MEAN])
    torch.testing.assert_close(model.dense.dense_encoding.std, saved[STD])
    module = load_module(ckpt).eval()
    data = _data(root / "clicks.csv", root / "cache-q")
    data.use_vocabulary(read_vocabulary(ckpt))
    batch = next(iter(data.val_dataloader()))
    with torch.no_grad():
        ours = torch.sigmoid(model(batch.dense, batch.sparse))
        theirs = torch.sigmoid(module(batch))
    assert (ours - theirs).abs().max() < 0.01  # quantization error only (unstandardized: ~0.08)


def _fit_argv(root: Path, run: str, *extra: str) -> list[str]:
    return ["fit", "--config", "configs/ctr/tabular.yaml", "--data.path", str(root / "clicks.csv"),
            *COLUMNS, "--data.batch_size", "256", "--trainer.max_epochs", "1",
            "--trainer.default_root_dir", str(root / run), *QUIET, *extra]  # fmt: skip


def test_the_command_line_chooses_the_encoding_and_refuses_an_unknown_one(fitted, capsys) -> None:
    root, _ = fitted
    main(_fit_argv(root, "none-run", "--model.backbone.init_args.dense_encoding", "none"))
    state = read_checkpoint(root / "none-run" / "checkpoints" / "last.ckpt")["state_dict"]
    torch.testing.assert_close(state[MEAN], torch.zeros(2))
    torch.testing.assert_close(state[STD], torch.ones(2))
    with pytest.raises(SystemExit) as exit_info:
        main(_fit_argv(root, "bad-run", "--model.backbone.init_args.dense_encoding", "log"))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "ssl-rec: error:" in line]
    assert len(lines) == 1 and "dense_encoding" in lines[0] and "Traceback" not in err
