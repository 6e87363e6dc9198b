import gzip

import numpy as np
import pytest
from criteo_lines import HEX, criteo_line, write_lines

from ssl_rec.data import CriteoDataModule, PreprocessOptions, read_criteo, write_criteo_tsv
from ssl_rec.data.sources.synthetic_clicks import render_ids


def test_parse_missing_hashes_negative(tmp_path):
    dense = ["", "-1", "3"] + ["0"] * 10
    cats = [""] + ["68fd1e64"] * 25
    path = write_lines(tmp_path / "a.txt", [criteo_line("1", dense, cats), criteo_line("0")])
    part = read_criteo(path)
    assert part.num_rows == 2 and part.label.tolist() == [1.0, 0.0]
    np.testing.assert_allclose(part.dense[0, :3], [0.0, 0.0, np.log(4.0)], rtol=1e-6)
    assert part.categorical[0].to_pylist() == [None, HEX]
    assert part.categorical[1].to_pylist() == ["68fd1e64", HEX]


def test_gz_and_unlabeled_detected(tmp_path, small_rows):
    plain = write_criteo_tsv(tmp_path / "t.txt", small_rows)
    packed = write_criteo_tsv(tmp_path / "t.txt.gz", small_rows, with_label=False)
    with gzip.open(packed, "rt") as f:
        assert f.readline().count("\t") == 38
    a, b = read_criteo(plain), read_criteo(packed)
    assert b.label is None and a.label is not None
    np.testing.assert_array_equal(a.dense, b.dense)
    np.testing.assert_array_equal(a.dense, np.log1p(small_rows.dense).astype(np.float32))
    raw = [
        None if i == 0 else v.decode()
        for i, v in zip(
            small_rows.sparse[:, 4], render_ids(4, small_rows.sparse[:, 4]), strict=True
        )
    ]
    assert b.categorical[4].to_pylist() == raw


def test_datamodule_vocab_roundtrip(tmp_path, criteo_file, small_rows):
    opts = PreprocessOptions(val_fraction=0.0, test_fraction=0.5)
    dm = CriteoDataModule(str(criteo_file), preprocess=opts, cache_dir=str(tmp_path))
    meta = dm.schema.metadata["splits"]
    assert meta["train"]["rows"] + meta["test"]["rows"] == 3000 and meta["val"]["rows"] == 0
    vocab = np.asarray(dm.vocabulary.id_values("C3").to_pylist())
    assert vocab[0] == "<missing>" and len(vocab) == dm.schema.field("C3").cardinality
    table = dm.split_table("train")
    ids = np.asarray(table.column("sparse").combine_chunks().flatten()).reshape(-1, 26)[:, 2]
    raw_train = set(vocab[ids[ids > 0]])
    assert raw_train <= {v.decode() for v in render_ids(2, small_rows.sparse[:, 2])}


def test_min_frequency_and_hashing(tmp_path, criteo_file):
    base = CriteoDataModule(str(criteo_file), cache_dir=str(tmp_path)).schema
    rare = CriteoDataModule(
        str(criteo_file), preprocess=PreprocessOptions(min_frequency=5), cache_dir=str(tmp_path)
    ).schema
    hashed = CriteoDataModule(
        str(criteo_file), preprocess=PreprocessOptions(max_vocab_size=50), cache_dir=str(tmp_path)
    ).schema
    assert rare.field("C3").cardinality < base.field("C3").cardinality
    assert hashed.field("C3").cardinality == 50 and "C3" in hashed.metadata["hashed_fields"]
    assert hashed.field("C1").cardinality == base.field("C1").cardinality


def test_split_by_day_mlperf_halves(tmp_path, small_rows):
    for d in range(4):
        write_criteo_tsv(tmp_path / "days" / f"day_{d}.gz", small_rows)
    dm = CriteoDataModule(str(tmp_path / "days"), cache_dir=str(tmp_path / "c"))
    splits = dm.schema.metadata["splits"]
    assert [len(splits[s]["files"]) for s in ("train", "val", "test")] == [3, 1, 1]
    assert splits["test"]["files"] == splits["val"]["files"]
    assert splits["test"]["files"][0].endswith("day_3.gz")
    assert [splits[s]["rows"] for s in ("train", "test", "val")] == [9000, 1500, 1500]
    day3 = read_criteo(tmp_path / "days" / "day_3.gz")
    test_label = dm.split_table("test").column("label").to_numpy()
    np.testing.assert_array_equal(test_label, day3.label[:1500])  # test = first half


def test_kaggle_layout_draws_val_and_test_from_train(tmp_path, small_rows):
    write_criteo_tsv(tmp_path / "k" / "train.txt", small_rows)
    write_criteo_tsv(tmp_path / "k" / "test.txt", small_rows, with_label=False)
    dm = CriteoDataModule(str(tmp_path / "k"), cache_dir=str(tmp_path / "c"))
    splits = dm.schema.metadata["splits"]
    assert all(dm.split_labeled(s) for s in ("train", "val", "test"))
    assert sum(splits[s]["rows"] for s in ("train", "val", "test")) == 3000
    assert 200 < splits["val"]["rows"] < 400 and 200 < splits["test"]["rows"] < 400
    assert all(f.endswith("train.txt") for s in splits.values() for f in s["files"])
    batch = next(iter(dm.val_dataloader()))
    assert batch.label is not None and batch.sparse.shape[1] == 26


def test_named_unlabeled_test_file_kept_when_train_is_unlabeled(tmp_path, small_rows):
    for name in ("train.txt", "val.txt", "test.txt"):
        write_criteo_tsv(tmp_path / "u" / name, small_rows, with_label=False)
    dm = CriteoDataModule(str(tmp_path / "u"), use_labels=False, cache_dir=str(tmp_path / "c"))
    assert not dm.split_labeled("test") and dm.schema.metadata["splits"]["test"]["rows"] == 3000
    assert next(iter(dm.test_dataloader())).label is None


def test_truncated_gzip_names_the_file(tmp_path, small_rows):
    whole = write_criteo_tsv(tmp_path / "whole.txt.gz", small_rows).read_bytes()
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"cut\.txt\.gz: truncated or corrupt file"):
        read_criteo(cut)


def test_all_rare_field_keeps_the_reserved_id(tmp_path):
    # Every value of C7 occurs once: with min_frequency 4 they all share id 0.
    lines = [
        criteo_line(str(i % 2), cats=[HEX] * 6 + [f"{i:08x}"] + [HEX] * 19) for i in range(200)
    ]
    path = write_lines(tmp_path / "rare.txt", lines)
    opts = PreprocessOptions(min_frequency=4)
    dm = CriteoDataModule(str(path), preprocess=opts, cache_dir=str(tmp_path / "c"))
    assert dm.schema.field("C7").cardinality == 2 and dm.schema.field("C1").cardinality == 2
    assert dm.vocabulary.id_values("C7").to_pylist() == ["<missing>", "<unused>"]
    batch = next(iter(dm.train_dataloader()))
    assert (batch.sparse[:, 6] == 0).all() and (batch.sparse[:, 0] == 1).all()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("\t".join(["0"] * 39), "line 2: expected 40 tab-separated columns, got 39"),
        (criteo_line(dense=["x"] + ["1"] * 12), "line 2: column 'I1' must be a number, got 'x'"),
        (criteo_line(label="2"), "line 2: label 'label' must be 0 or 1"),
        (criteo_line(dense=["nan"] + ["1"] * 12), "line 2: column 'I1' must be finite"),
        (criteo_line(dense=["1", "inf"] + ["1"] * 11), "line 2: column 'I2' must be finite"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, line, message):
    path = write_lines(tmp_path / "bad.txt", [criteo_line(), line, criteo_line()])
    with pytest.raises(ValueError, match=message) as info:
        read_criteo(path)
    assert str(path) in str(info.value)
    part = read_criteo(path, on_bad_row="skip")
    assert part.num_rows == 2 and part.skipped == 1


def test_skip_is_recorded_in_schema(tmp_path):
    lines = [criteo_line()] * 20 + [criteo_line(label="x"), "\t".join(["1"] * 12)]
    path = write_lines(tmp_path / "bad.txt", lines)
    opts = PreprocessOptions(on_bad_row="skip", val_fraction=0.0, test_fraction=0.0)
    schema = CriteoDataModule(str(path), preprocess=opts, cache_dir=str(tmp_path)).schema
    assert schema.metadata["skipped_rows"] == 2
    assert schema.metadata["splits"]["train"]["rows"] == 20


def test_empty_missing_and_bad_options(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="empty.txt: file is empty"):
        read_criteo(tmp_path / "empty.txt")
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        read_criteo(tmp_path / "nope.txt")
    with pytest.raises(ValueError, match="on_bad_row must be one of"):
        PreprocessOptions(on_bad_row="ignore")
    with pytest.raises(ValueError, match="min_frequency must be >= 1, got 0"):
        PreprocessOptions(min_frequency=0)
    with pytest.raises(ValueError, match="val_fraction must be in"):
        PreprocessOptions(val_fraction=1.5)
    with pytest.raises(ValueError, match="has_label=False"):
        read_criteo(write_lines(tmp_path / "a.txt", [criteo_line()]), has_label=False)


def test_real_sample_layout_parses(tmp_path):
    # Hand-check against the shape of a real Criteo line (negative I2, empty cells).
    line = "0\t\t-1\t19\t35\t30251\t247\t1\t35\t160\t\t1\t\t35\t" + "\t".join(
        ["68fd1e64"] * 20 + ["", "", "5155d8a3", "", "be7c41b4", ""]
    )
    part = read_criteo(write_lines(tmp_path / "r.txt", [line]))
    assert part.dense[0, 1] == 0.0 and part.dense[0, 2] == pytest.approx(np.log(20.0))
    assert part.categorical[20].to_pylist() == [None]
