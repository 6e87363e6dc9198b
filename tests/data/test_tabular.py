import gzip
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ssl_rec.data import PreprocessOptions, TabularDataModule, read_tabular

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
    assert sorted(dm.vocabulary.id_values("cat").to_pylist()[1:]) == ["a", "b", "c"]
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
    with pytest.raises(
        ValueError, match="t.csv, line 6: expected 5 comma-separated columns, got 3"
    ):
        read_tabular(path, "clicked", ["age"], ["city"])
    part = read_tabular(path, "clicked", ["age"], ["city"], on_bad_row="skip")
    assert part.num_rows == 3 and part.skipped == 2
    (tmp_path / "e.csv").write_text("")
    with pytest.raises(ValueError, match="e.csv: file is empty"):
        read_tabular(tmp_path / "e.csv", "clicked", ["age"], [])


def test_labels_written_by_pandas_as_true_false_are_read(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text("clicked,age,city\nTrue,1,a\nfalse,2,b\n TRUE ,3,a\n0,4,b\n1.0,5,a\n")
    assert read_tabular(path, "clicked", ["age"], ["city"]).label.tolist() == [1, 0, 1, 0, 1]
    for cell, got in (("no", "'no'"), ("2", "'2'"), ("", "a missing value")):
        (tmp_path / "x.csv").write_text(f"clicked,age,city\n1,1,a\n{cell},2,b\n")
        message = f"x.csv, line 3: label 'clicked' must be 0 or 1 (or true / false), got {got}"
        with pytest.raises(ValueError, match=re.escape(message)):
            read_tabular(tmp_path / "x.csv", "clicked", ["age"], ["city"])
    skipped = read_tabular(tmp_path / "x.csv", "clicked", ["age"], ["city"], on_bad_row="skip")
    assert skipped.label.tolist() == [1] and skipped.skipped == 1
    pa_table = pa.table({"clicked": [True, False], "age": [1.0, 2.0], "city": ["a", "b"]})
    pq.write_table(pa_table, tmp_path / "b.parquet")
    parquet = read_tabular(tmp_path / "b.parquet", "clicked", ["age"], ["city"])
    assert parquet.label.tolist() == [1, 0]


def _rows(n=60):
    lines = ["clicked,age,city"]
    lines += [f"{i % 2},{i},{['paris', 'rome', 'NA', 'null'][i % 4]}" for i in range(n)]
    return "\n".join(lines) + "\n"


def test_gzip_csv_matches_plain(tmp_path):
    (tmp_path / "p.csv").write_text(_rows())
    with gzip.open(tmp_path / "z.csv.gz", "wt") as f:
        f.write(_rows())
    plain = read_tabular(tmp_path / "p.csv", "clicked", ["age"], ["city"])
    packed = read_tabular(tmp_path / "z.csv.gz", "clicked", ["age"], ["city"])
    np.testing.assert_array_equal(plain.dense, packed.dense)
    assert plain.categorical[0].to_pylist() == packed.categorical[0].to_pylist()
    dm = TabularDataModule(str(tmp_path / "z.csv.gz"), "clicked", ["age"], ["city"],
                           cache_dir=str(tmp_path / "c"))  # fmt: skip
    assert dm.schema.metadata["splits"]["train"]["rows"] > 0


def test_missing_values_are_an_explicit_option(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(_rows(8) + "1,,\n")
    default = read_tabular(path, "clicked", ["age"], ["city"])
    assert default.categorical[0].to_pylist()[:4] == ["paris", "rome", "NA", "null"]
    assert default.categorical[0].to_pylist()[-1] is None
    spelled = read_tabular(path, "clicked", ["age"], ["city"], missing_values=("", "NA", "null"))
    assert spelled.categorical[0].to_pylist()[:4] == ["paris", "rome", None, None]
    (tmp_path / "d.csv").write_text("clicked,age,city\n1,NA,x\n")
    with pytest.raises(ValueError, match=r"d.csv, line 2: column 'age' must be a number, got 'NA'"):
        read_tabular(tmp_path / "d.csv", "clicked", ["age"], ["city"])
    ok = read_tabular(tmp_path / "d.csv", "clicked", ["age"], ["city"], missing_values=("NA",))
    assert ok.dense[0, 0] == 0.0
    with pytest.raises(ValueError, match="missing_values must be a list of strings"):
        PreprocessOptions(missing_values="NA")


def test_missing_spellings_and_nan_in_parquet_and_text(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"clicked": [1, 0, 1], "age": [20.0, float("nan"), 30.0],
                      "city": [1.5, float("nan"), 2.5]})  # fmt: skip
    pq.write_table(table, tmp_path / "t.parquet")
    (tmp_path / "t.csv").write_text("clicked,age,city\n1,20,x\n0,NaN,NAN\n1,30,y\n")
    hint = r"\(preprocess.missing_values: \[\"\", \"nan\"\] reads NaN as missing\)"
    for name in ("t.parquet", "t.csv"):
        with pytest.raises(ValueError, match=r"(row 1|line 3): column 'age' must be finite, "
                           r"got nan " + hint):  # fmt: skip
            read_tabular(tmp_path / name, "clicked", ["age"], ["city"])
        read = read_tabular(tmp_path / name, "clicked", ["age"], ["city"],
                            missing_values=("", "nan"))  # fmt: skip
        np.testing.assert_allclose(read.dense[:, 0], np.log1p([20.0, 0.0, 30.0]), rtol=1e-6)
        assert read.categorical[0].to_pylist()[1] is None, name
    wide_text = pa.table({"clicked": [1, 0], "age": pa.array(["1", "NA"], pa.large_string()),
                          "city": pa.array(["x", "NA"], pa.large_string())})  # fmt: skip
    pq.write_table(wide_text, tmp_path / "large_string.parquet")  # polars' string columns
    read = read_tabular(tmp_path / "large_string.parquet", "clicked", ["age"], ["city"],
                        missing_values=("", "NA"))  # fmt: skip
    assert read.dense[1, 0] == 0.0 and read.categorical[0].to_pylist() == ["x", None]
    (tmp_path / "inf.csv").write_text("clicked,age,city\n1,inf,x\n")
    with pytest.raises(ValueError, match=r"column 'age' must be finite, got inf$"):
        read_tabular(tmp_path / "inf.csv", "clicked", ["age"], ["city"], missing_values=("nan",))


def test_label_typo_is_reported_before_any_work(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(_rows())
    dm = TabularDataModule(str(path), "clickd", ["age"], ["city"], cache_dir=str(tmp_path / "c"))
    with pytest.raises(
        ValueError,
        match=r"t.csv: label column 'clickd' not found; available columns: "
        r"\['clicked', 'age', 'city'\]",
    ):
        dm.schema  # noqa: B018
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())
    with pytest.raises(ValueError, match=r"unknown columns \['town'\]"):
        bad = TabularDataModule(str(path), "clicked", ["age"], ["town"])
        bad.schema  # noqa: B018
    unlabeled = TabularDataModule(str(path), None, ["age"], ["city"], use_labels=False,
                                  cache_dir=str(tmp_path / "c"))  # fmt: skip
    assert unlabeled.schema.label is None and not unlabeled.split_labeled("train")
    with pytest.raises(ValueError, match="label=None .* needs use_labels=False"):
        TabularDataModule(str(path), None, ["age"], ["city"])


def test_directory_with_unlabeled_test_draws_splits_from_train(tmp_path):
    (tmp_path / "train.csv").write_text(_rows(400))
    (tmp_path / "test.csv").write_text("age,city\n1,rome\n")
    dm = TabularDataModule(
        str(tmp_path), "clicked", ["age"], ["city"], cache_dir=str(tmp_path / "c")
    )
    splits = dm.schema.metadata["splits"]
    assert all(splits[s]["labeled"] and splits[s]["rows"] > 0 for s in ("train", "val", "test"))
    assert sum(splits[s]["rows"] for s in ("train", "val", "test")) == 400
