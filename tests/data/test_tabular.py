import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ssl_rec.data import TabularDataModule, read_tabular
from ssl_rec.vocabulary import load_vocabulary

CSV = "clicked,age,price,city,item\n1,30,2.5,paris,7\n0,,1.0,rome,8\n1,40,3.0,paris,7\n"


def test_csv_reads_strings_and_ints(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(CSV)
    part = read_tabular(path, "clicked", ["age", "price"], ["city", "item"])
    assert part.label.tolist() == [1.0, 0.0, 1.0]
    np.testing.assert_allclose(part.dense[1], [0.0, np.log(2.0)], rtol=1e-6)
    assert part.categorical[1].to_pylist() == ["7", "8", "7"]


def test_directory_splits_parquet(tmp_path):
    rng = np.random.default_rng(0)
    for name, n in (("train", 300), ("valid", 50), ("test", 40)):
        pq.write_table(
            pa.table(
                {
                    "y": rng.integers(0, 2, n),
                    "x": rng.random(n),
                    "cat": rng.choice(["a", "b", "c"], n),
                    "num": rng.integers(0, 5, n),
                }
            ),
            tmp_path / f"{name}.parquet",
        )
    dm = TabularDataModule(
        str(tmp_path), "y", ["x"], ["cat", "num"], batch_size=64, cache_dir=str(tmp_path / "cache")
    )
    assert [dm.schema.metadata["splits"][s]["rows"] for s in ("train", "val", "test")] == [
        300,
        50,
        40,
    ]
    assert dm.schema.cardinalities == [4, 6]
    assert sorted(load_vocabulary(dm.schema, "cat")[1:]) == ["a", "b", "c"]
    batch = next(iter(dm.train_dataloader()))
    assert batch.dense.shape == (64, 1) and batch.sparse.shape == (64, 2)


def test_unknown_columns_listed(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(CSV)
    with pytest.raises(
        ValueError,
        match=r"unknown columns \['town'\]; available columns: "
        r"\['clicked', 'age', 'price', 'city', 'item'\]",
    ):
        read_tabular(path, "clicked", ["age"], ["town"])
    pq.write_table(pa.table({"a": [1]}), tmp_path / "t.parquet")
    with pytest.raises(ValueError, match="unknown columns"):
        read_tabular(tmp_path / "t.parquet", "y", [], ["a"])


def test_tabular_bad_rows(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(CSV + "1,abc,1,rome,3\n0,1,1\n")
    with pytest.raises(ValueError, match="t.csv, line 6: expected 5 columns, got 3"):
        read_tabular(path, "clicked", ["age"], ["city"])
    part = read_tabular(path, "clicked", ["age"], ["city"], on_bad_row="skip")
    assert part.num_rows == 3 and part.skipped == 2
    (tmp_path / "e.csv").write_text("")
    with pytest.raises(ValueError, match="e.csv: file is empty"):
        read_tabular(tmp_path / "e.csv", "clicked", ["age"], [])
