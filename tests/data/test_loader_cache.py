import os
import signal
import subprocess
import sys
import threading
import time

import filelock
import numpy as np
import pytest
import torch

from ssl_rec.data import BatchLoader, CriteoDataModule, PreprocessOptions, validate_sparse
from ssl_rec.data import preprocess as preprocess_module
from ssl_rec.data.storage import (
    ShardWriter,
    cache_key,
    cached_build,
    open_split,
    record_batch,
    split_schema,
)
from ssl_rec.schema import CategoricalField, FeatureSchema


@pytest.fixture
def table(tmp_path):
    rng = np.random.default_rng(0)
    schema = split_schema(13, 26, True, False)
    with ShardWriter(tmp_path / "train", schema, shard_rows=500) as w:
        for n in (700, 700, 301):
            sparse = rng.integers(0, 9, (n, 26))
            w.write(record_batch(schema, rng.random((n, 13)), sparse, rng.random(n) < 0.5))
    assert [rows for _, rows in w.shards] == [500, 500, 500, 201]
    return open_split(tmp_path, "train").data.table


def _rows(loader):
    return np.concatenate([b.row_id.numpy() for b in loader])


@pytest.mark.parametrize(("shuffle", "block_rows"), [(False, 512), (True, 512), (True, 300)])
def test_every_row_once_across_shards(table, shuffle, block_rows):
    loader = BatchLoader(table, 128, shuffle=shuffle, block_rows=block_rows)
    batches = list(loader)
    ids = _rows(batches)
    assert len(batches) == len(loader) == 14
    assert [b.batch_size for b in batches] == [128] * 13 + [37]
    assert np.array_equal(np.sort(ids), np.arange(1701))
    assert np.array_equal(ids, np.arange(1701)) != shuffle
    b = batches[0]
    assert b.dense.dtype == torch.float32 and b.dense.shape == (128, 13)
    assert b.sparse.dtype == torch.int64 and b.sparse.shape == (128, 26)
    assert b.label.dtype == torch.float32 and b.row_id.dtype == torch.int64
    dense = np.asarray(table.column("dense").combine_chunks().flatten()).reshape(-1, 13)
    np.testing.assert_array_equal(b.dense.numpy(), dense[b.row_id.numpy()])


def test_shuffle_mixes_shards(table):
    first = next(iter(BatchLoader(table, 256, shuffle=True, block_rows=100))).row_id.numpy()
    assert len(set(first // 500)) > 1  # one batch draws rows of several shards


def test_epochs_differ_and_drop_last(table):
    loader = BatchLoader(table, 100, shuffle=True, drop_last=True, block_rows=400)
    first, second = _rows(loader), _rows(loader)
    assert len(first) == 1700 and len(loader) == 17 and not np.array_equal(first, second)
    assert all(b.batch_size == 100 for b in loader)


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_disjoint_equal_and_drop_less_than_a_batch(table, drop_last):
    def loaders(epoch):
        out = [BatchLoader(table, 64, shuffle=True, drop_last=drop_last, block_rows=256,
                           rank=r, world_size=4) for r in range(4)]  # fmt: skip
        for loader in out:
            loader.set_epoch(epoch)
        return out

    shards = [_rows(loader) for loader in loaders(0)]
    assert len({len(s) for s in shards}) == 1 and len({len(lo) for lo in loaders(0)}) == 1
    assert len(set(np.concatenate(shards))) == sum(map(len, shards))
    assert all(425 - len(s) < 64 for s in shards)  # 1701 // 4 = 425 rows per rank
    later = [_rows(loader) for loader in loaders(1)]
    assert set(later[0]) != set(shards[0])  # ranks see other blocks in another epoch


@pytest.mark.parametrize(("shuffle", "rank", "stop"), [(True, 0, 5), (True, 1, 1), (False, 0, 3)])
def test_resume_mid_epoch_yields_the_rest_of_the_uninterrupted_epoch(table, shuffle, rank, stop):
    def make():  # blocks are not whole batches: batches straddle blocks and shards
        return BatchLoader(table, 60, shuffle=shuffle, seed=3, block_rows=170, rank=rank,
                           world_size=2)  # fmt: skip

    whole = make()
    whole.set_epoch(2)
    expected = [b.row_id.numpy() for b in whole]
    interrupted = make()
    interrupted.set_epoch(2)
    for i, _ in enumerate(interrupted):
        if i + 1 == stop:
            state = interrupted.state_dict()
            break
    resumed = make()
    resumed.load_state_dict(state)
    rest = [b.row_id.numpy() for b in resumed]
    assert state["batches"] == stop and len(rest) == len(expected) - stop
    for a, b in zip(rest, expected[stop:], strict=True):
        np.testing.assert_array_equal(a, b)
    assert resumed.epoch == 3 and resumed.state_dict()["batches"] == len(expected)
    with pytest.raises(ValueError, match="loader position"):
        BatchLoader(table, 61, shuffle=shuffle, seed=3).load_state_dict(state)


def test_unlabeled_and_validate_sparse(table):
    batch = next(iter(BatchLoader(table, 10, with_labels=False)))
    assert batch.label is None
    with pytest.raises(ValueError, match="row 1, field 2: id 7 outside the allowed range 0..4"):
        validate_sparse(np.array([[0, 0, 0], [0, 0, 7]]), [5, 5, 5], "x: ")
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        BatchLoader(table, 0)


def test_empty_split_has_one_empty_shard(tmp_path):
    with ShardWriter(tmp_path / "val", split_schema(2, 3, True, False)) as w:
        pass
    assert w.rows == 0 and open_split(tmp_path, "val").num_rows == 0
    with pytest.raises(FileNotFoundError, match="no preprocessed split 'test'"):
        open_split(tmp_path, "test")


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

    monkeypatch.setattr(preprocess_module, "encode_batch", boom)
    opts = PreprocessOptions(min_frequency=4)
    with pytest.raises(KeyboardInterrupt):
        CriteoDataModule(str(criteo_file), preprocess=opts, cache_dir=cache).schema  # noqa: B018
    names = {p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")}
    assert names == {a.data_dir.name, other.data_dir.name}
    monkeypatch.undo()
    rebuilt = CriteoDataModule(str(criteo_file), preprocess=opts, cache_dir=cache)
    assert rebuilt.schema.metadata["splits"]["train"]["rows"] > 0


KILLED_RUN = """
import os, signal, sys
import ssl_rec.data.preprocess as pre
from ssl_rec.data import CriteoDataModule
real = pre.encode_batch
def encode_then_die(*args):
    out = real(*args)
    os.kill(os.getpid(), signal.SIGKILL)
pre.encode_batch = encode_then_die
CriteoDataModule(sys.argv[1], cache_dir=sys.argv[2]).schema
"""


def test_killed_run_leaves_nothing_trusted_and_is_cleaned(tmp_path, criteo_file):
    cache = tmp_path / "cache"
    run = subprocess.run([sys.executable, "-c", KILLED_RUN, str(criteo_file), str(cache)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == -signal.SIGKILL, run.stderr
    leftovers = [p for p in cache.iterdir() if p.name.endswith(".tmp")]
    assert len(leftovers) == 1 and any(leftovers[0].iterdir())
    dm = CriteoDataModule(str(criteo_file), cache_dir=str(cache))
    assert dm.schema.metadata["splits"]["train"]["rows"] > 0
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == [
        dm.data_dir.name
    ]
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]


def test_second_build_waits_for_the_lock(tmp_path, caplog):
    inputs = {"x": 1}
    final = tmp_path / f"demo-{cache_key(inputs)}"
    built = []

    def build(out, final_dir):
        built.append(time.monotonic())
        return FeatureSchema(["I1"], [CategoricalField("C1", 4)], "label")

    result = {}
    caplog.set_level("INFO", logger="ssl_rec.data.storage")
    with filelock.FileLock(final.with_name(f".{final.name}.lock")):
        worker = threading.Thread(
            target=lambda: result.update(entry=cached_build(tmp_path, "demo", inputs, build))
        )
        worker.start()
        time.sleep(0.5)
        assert not built and worker.is_alive()  # waiting for the holder
    worker.join(timeout=30)
    assert len(built) == 1 and result["entry"][0] == final
    assert cached_build(tmp_path, "demo", inputs, build)[0] == final and len(built) == 1
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for")]
    assert waits == [f"waiting for {final.with_name(f'.{final.name}.lock')}: another process "
                     f"is building {final}; waiting for it"]  # fmt: skip


TWO_BUILDERS = """
import logging, os, sys, time
from pathlib import Path
from ssl_rec.data.storage import cached_build
from ssl_rec.schema import CategoricalField, FeatureSchema
logging.basicConfig(level=logging.INFO, format="%(message)s")
root, ready, built = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
def build(out, final):
    with open(built, "a") as f:
        f.write(f"{os.getpid()}\\n")
    deadline = time.monotonic() + 120
    while len(list(ready.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # the other process, ready too, is waiting for the lock by now
    return FeatureSchema(["I1"], [CategoricalField("C1", 4)], "label")
(ready / str(os.getpid())).touch()
print(cached_build(root, "demo", {"x": 1}, build)[0])
"""


def test_two_processes_building_one_entry_build_it_once(tmp_path):
    """Two runs needing the same entry at once: one builds it, the other waits and uses it."""
    ready, built = tmp_path / "ready", tmp_path / "built.txt"
    ready.mkdir()
    runs = [subprocess.Popen([sys.executable, "-c", TWO_BUILDERS, str(tmp_path / "cache"),
                              str(ready), str(built)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
            for _ in range(2)]  # fmt: skip
    outs = [run.communicate(timeout=240) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outs
    assert len(built.read_text().splitlines()) == 1, outs  # built once
    entry = tmp_path / "cache" / f"demo-{cache_key({'x': 1})}"
    assert [out.strip() for out, _ in outs] == [str(entry)] * 2
    waited = [err.count("another process is building") for _, err in outs]
    assert sorted(waited) == [0, 1], outs  # the other one waited, and said so once


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
    assert os.path.getsize(path) > 0
