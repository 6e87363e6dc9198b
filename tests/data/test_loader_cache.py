import numpy as np
import pytest
import torch

from ssl_rec.data import BatchLoader, CriteoDataModule, PreprocessOptions, validate_sparse
from ssl_rec.data import preprocess as preprocess_module
from ssl_rec.data.storage import SplitWriter, open_split, split_schema
from ssl_rec.schema import CategoricalField, FeatureSchema


@pytest.fixture
def table(tmp_path):
    rng = np.random.default_rng(0)
    with SplitWriter(tmp_path / "train.arrow", split_schema(13, 26, True, False)) as w:
        for n in (700, 700, 301):
            w.write(rng.random((n, 13)), rng.integers(0, 9, (n, 26)), rng.random(n) < 0.5)
    return open_split(tmp_path, "train").data.table


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_row_once(table, shuffle):
    loader = BatchLoader(table, 128, shuffle=shuffle, block_rows=512)
    batches = list(loader)
    ids = np.concatenate([b.row_id.numpy() for b in batches])
    assert len(batches) == len(loader) == 14
    assert np.array_equal(np.sort(ids), np.arange(1701))
    assert np.array_equal(ids, np.arange(1701)) != shuffle
    b = batches[0]
    assert b.dense.dtype == torch.float32 and b.dense.shape == (128, 13)
    assert b.sparse.dtype == torch.int64 and b.sparse.shape == (128, 26)
    assert b.label.dtype == torch.float32 and b.row_id.dtype == torch.int64
    dense = np.asarray(table.column("dense").combine_chunks().flatten()).reshape(-1, 13)
    np.testing.assert_array_equal(b.dense.numpy(), dense[b.row_id.numpy()])


def test_epochs_differ_and_drop_last(table):
    loader = BatchLoader(table, 100, shuffle=True, drop_last=True, block_rows=400)
    first = np.concatenate([b.row_id.numpy() for b in loader])
    second = np.concatenate([b.row_id.numpy() for b in loader])
    assert len(first) == 1700 and len(loader) == 17 and not np.array_equal(first, second)
    assert all(b.batch_size == 100 for b in loader)


def test_sharding_disjoint(table):
    shards = [
        np.concatenate(
            [b.row_id.numpy() for b in BatchLoader(table, 64, shuffle=True, rank=r, world_size=3)]
        )
        for r in range(3)
    ]
    assert all(len(s) == 567 for s in shards)
    assert len(set(np.concatenate(shards))) == 3 * 567


def test_unlabeled_and_validate_sparse(table):
    batch = next(iter(BatchLoader(table, 10, with_labels=False)))
    assert batch.label is None
    with pytest.raises(ValueError, match="row 1, field 2: id 7 outside the allowed range 0..4"):
        validate_sparse(np.array([[0, 0, 0], [0, 0, 7]]), [5, 5, 5], "x: ")
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        BatchLoader(table, 0)


def test_schema_roundtrip(tmp_path):
    s = FeatureSchema(["I1"], [CategoricalField("C1", 10)], "label", {"vocab_dir": "v"})
    loaded = FeatureSchema.load(s.save(tmp_path))
    assert loaded == s and loaded.metadata == {"vocab_dir": "v"}


def test_cache_key_and_interrupted_build(tmp_path, criteo_file, monkeypatch):
    cache = str(tmp_path / "cache")
    a = CriteoDataModule(str(criteo_file), cache_dir=cache)
    same = CriteoDataModule(str(criteo_file), cache_dir=cache)
    other = CriteoDataModule(
        str(criteo_file), preprocess=PreprocessOptions(min_frequency=3), cache_dir=cache
    )
    assert a.data_dir == same.data_dir and a.data_dir != other.data_dir

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(preprocess_module, "_write_split", boom)
    opts = PreprocessOptions(min_frequency=4)
    with pytest.raises(KeyboardInterrupt):
        CriteoDataModule(str(criteo_file), preprocess=opts, cache_dir=cache).schema  # noqa: B018
    names = {p.name for p in (tmp_path / "cache").iterdir()}
    assert names == {a.data_dir.name, other.data_dir.name}
    monkeypatch.undo()
    rebuilt = CriteoDataModule(str(criteo_file), preprocess=opts, cache_dir=cache)
    assert rebuilt.schema.metadata["splits"]["train"]["rows"] > 0


def test_input_change_invalidates(tmp_path, small_rows):
    from ssl_rec.data import write_criteo_tsv

    path = write_criteo_tsv(tmp_path / "d.txt", small_rows)
    first = CriteoDataModule(str(path), cache_dir=str(tmp_path / "c")).data_dir
    write_criteo_tsv(
        path,
        type(small_rows)(
            *(
                getattr(small_rows, f)[:100]
                for f in ("dense", "dense_missing", "sparse", "prob", "label", "user_cluster")
            )
        ),
    )
    assert CriteoDataModule(str(path), cache_dir=str(tmp_path / "c")).data_dir != first
