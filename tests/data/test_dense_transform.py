"""What a dense value becomes: DLRM's clipped log, a signed log, the value as read, one of
those per column, or ``auto`` (the log where a column's training values are >= 0); chosen per
data block and carried by the checkpoint."""

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ssl_rec.cli import run
from ssl_rec.data import PreprocessOptions, TabularDataModule, read_tabular
from ssl_rec.data.parsing import Origin, parse_dense

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false"]


def test_each_transform_of_a_column_with_negative_and_missing_values() -> None:
    column = pa.chunked_array([pa.array([-3.0, 0.0, 2.0, None])])
    expected = {
        "log1p": [0.0, 0.0, np.log(3.0), 0.0],
        "signed_log1p": [-np.log(4.0), 0.0, np.log(3.0), 0.0],
        "none": [-3.0, 0.0, 2.0, 0.0],
    }
    for transform, values in expected.items():
        dense, bad = parse_dense([column], ["balance"], Origin("t.csv", 2), False, transform)
        np.testing.assert_allclose(dense[:, 0], values, rtol=1e-6, err_msg=transform)
        assert not bad.any()


def test_the_option_is_checked_and_keeps_old_cache_keys() -> None:
    with pytest.raises(ValueError, match=r"must be one of .*'auto'\) or a mapping .* got 'log'"):
        PreprocessOptions(dense_transform="log")
    with pytest.raises(ValueError, match=r"dense_transform of column 'price' must be one of"):
        PreprocessOptions(dense_transform={"price": "auto"})
    assert "dense_transform" not in PreprocessOptions().to_dict()
    assert PreprocessOptions(dense_transform="none").to_dict()["dense_transform"] == "none"
    assert PreprocessOptions(dense_transform="auto").parse_transform == "none"
    assert PreprocessOptions(dense_transform="signed_log1p").parse_transform == "signed_log1p"


def _table(path: Path, n: int = 400, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    balance = rng.normal(-50.0, 30.0, n).round(2)  # mostly negative
    shop = rng.integers(0, 8, n)
    click = (rng.random(n) < 1 / (1 + np.exp(balance / 30.0 + 1.0))).astype(int)
    lines = [f"{c},{b},s{s}" for c, b, s in zip(click, balance, shop, strict=True)]
    path.write_text("\n".join(["clicked,balance,shop", *lines]) + "\n")
    return path


def test_a_mostly_negative_column_survives_only_without_the_clip(tmp_path: Path) -> None:
    path = _table(tmp_path / "t.csv")
    clipped = read_tabular(path, "clicked", ["balance"], ["shop"]).dense[:, 0]
    signed = read_tabular(path, "clicked", ["balance"], ["shop"],
                          dense_transform="signed_log1p").dense[:, 0]  # fmt: skip
    raw = np.loadtxt(path, delimiter=",", skiprows=1, usecols=1)
    assert (clipped == 0).mean() > 0.9  # the column is nearly lost
    np.testing.assert_allclose(signed, np.sign(raw) * np.log1p(np.abs(raw)), rtol=1e-5)
    stats = {}
    for transform in ("log1p", "signed_log1p"):
        dm = TabularDataModule(str(path), "clicked", ["balance"], ["shop"],
                               preprocess=PreprocessOptions(dense_transform=transform),
                               cache_dir=str(tmp_path / "cache"))  # fmt: skip
        stats[transform] = dm.dense_statistics
    assert stats["signed_log1p"].mean[0] < -3.0 < stats["log1p"].mean[0]


def _two_columns(path: Path, n: int = 400, seed: int = 0) -> Path:
    """``balance`` (mostly negative, linear in the logit) and ``visits`` (counts >= 0)."""
    rng = np.random.default_rng(seed)
    balance, visits = rng.normal(-50.0, 30.0, n).round(2), rng.poisson(3.0, n)
    click = (rng.random(n) < 1 / (1 + np.exp(balance / 30.0 + 1.0))).astype(int)
    lines = [f"{c},{b},{v},s{v % 3}" for c, b, v in zip(click, balance, visits, strict=True)]
    path.write_text("\n".join(["clicked,balance,visits,shop", *lines]) + "\n")
    return path


def _module(path: Path, cache: Path, transform: object, **options: object) -> TabularDataModule:
    preprocess = PreprocessOptions(dense_transform=transform, **options)
    return TabularDataModule(str(path), "clicked", ["balance", "visits"], ["shop"],
                             preprocess=preprocess, cache_dir=str(cache))  # fmt: skip


def _dense(dm: TabularDataModule, split: str) -> np.ndarray:
    return (
        dm.split_table(split).column("dense").combine_chunks().flatten().to_numpy().reshape(-1, 2)
    )


def test_auto_keeps_the_log_for_counts_and_raw_values_where_a_column_is_negative(
    tmp_path: Path,
) -> None:
    path = _two_columns(tmp_path / "t.csv")
    auto = _module(path, tmp_path / "c", "auto")
    assert auto.dense_transforms == {"balance": "none", "visits": "log1p"}
    assert auto.hparams["preprocess"]["dense_transform"] == auto.dense_transforms
    mapped = _module(path, tmp_path / "c", {"balance": "none", "visits": "log1p"})
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(_dense(auto, split), _dense(mapped, split))
    raw = np.loadtxt(path, delimiter=",", skiprows=1, usecols=(1, 2))
    train = _dense(auto, "train")
    assert np.isin(train[:, 0], raw[:, 0].astype(np.float32)).all()  # values as read
    assert set(np.round(np.expm1(train[:, 1]), 3)) <= set(raw[:, 1])  # log1p of the counts
    with pytest.raises(ValueError, match=r"dense columns are \['balance', 'visits'\] \(missing"):
        _ = _module(path, tmp_path / "c", {"balance": "none"}).schema


def test_auto_with_a_models_vocabulary_decides_from_the_training_rows_or_says_why_not(
    tmp_path: Path,
) -> None:
    path = _two_columns(tmp_path / "t.csv")
    fitted = _module(path, tmp_path / "c", "auto")
    again = _module(path, tmp_path / "c2", "auto")
    again.use_vocabulary(fitted.vocabulary)  # no counting pass: a pass over training minima
    assert again.dense_transforms == fitted.dense_transforms
    np.testing.assert_array_equal(_dense(again, "test"), _dense(fitted, "test"))
    whole = _module(path, tmp_path / "c3", "auto", val_fraction=0.0, test_fraction=1.0)
    whole.use_vocabulary(fitted.vocabulary)
    with pytest.raises(ValueError, match="decides from the training rows and this data has none"):
        _ = whole.schema


def test_the_shipped_own_data_configs_choose_per_column_and_the_checkpoint_carries_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for block in ("tabular", "tabular_unlabeled", "tabular_semi_supervised"):
        text = (ROOT / f"configs/common/data/{block}.yaml").read_text()
        assert "dense_transform: auto" in text, block
    monkeypatch.chdir(tmp_path)
    _table(tmp_path / "train.csv")
    own = ["--data.label=clicked", "--data.dense=[balance]", "--data.categorical=[shop]"]
    run(["fit", "--config", str(ROOT / "configs/ctr/tabular.yaml"), "--data.path=train.csv",
         *own, "--trainer.max_epochs=1", "--trainer.default_root_dir=fit",
         "--data.cache_dir=cache", *QUIET])  # fmt: skip
    _table(tmp_path / "new.csv", 50, seed=1)
    run(["predict", "--ckpt_path=fit/checkpoints/last.ckpt", "--data.path=new.csv",
         "--data.cache_dir=cache2", "--trainer.default_root_dir=out",
         "--predictions.out=pred.parquet", *QUIET])  # fmt: skip
    schemas = [json.loads(p.read_text()) for p in Path("cache2").glob("*/schema.json")]
    assert [s["metadata"]["options"]["dense_transform"] for s in schemas] == [{"balance": "none"}]
    # The shipped config again (auto) with the checkpoint: the model's choice, the same scores.
    run(["predict", "--config", str(ROOT / "configs/ctr/tabular.yaml"), "--data.path=new.csv",
         *own, "--ckpt_path=fit/checkpoints/last.ckpt", "--data.cache_dir=cache3",
         "--trainer.default_root_dir=out3", "--predictions.out=pred3.parquet", *QUIET])  # fmt: skip
    scores = [pq.read_table(p).column("probability").to_pylist()
              for p in ("pred.parquet", "pred3.parquet")]  # fmt: skip
    assert scores[0] == scores[1]
