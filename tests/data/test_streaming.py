"""Streaming preprocessing equals an in-memory reference bit for bit, whatever the block size."""

import gzip
import math
import shutil

import numpy as np
import pytest

from ssl_rec.data import (
    CriteoDataModule,
    PreprocessOptions,
    read_criteo,
    reading,
    spill,
    write_criteo_tsv,
)
from ssl_rec.data.sources.synthetic_clicks import SyntheticRows
from ssl_rec.schema import CRITEO_CATEGORICAL
from ssl_rec.vocab import Vocabularies, Vocabulary, count_values, merge_counts

SPLITS = ("train", "val", "test")


def _slice(rows, start, stop):
    return SyntheticRows(
        *(getattr(rows, f)[start:stop] for f in SyntheticRows.__dataclass_fields__)
    )


def _split_codes(parts, options, sizes):
    """Split index (0 train, 1 val, 2 test) of every row of each part, in plan order."""
    rng = np.random.default_rng(options.split_seed)
    out = []
    for (_, mode), n in zip(parts, sizes, strict=True):
        if mode == "random":
            r = rng.random(n)
            t, v = options.test_fraction, options.val_fraction
            out.append(np.where(r < t, 2, np.where(r < t + v, 1, 0)))
        elif mode == "halves":
            out.append(np.r_[np.full(math.ceil(n / 2), 2), np.full(n - math.ceil(n / 2), 1)])
        else:
            out.append(np.full(n, SPLITS.index(mode)))
    return out


def _chosen(parts, options):
    """Each split's rows, whole files in memory: ``parts`` is ``[(path, mode)]`` in plan order."""
    read = [read_criteo(path) for path, _ in parts]
    codes = _split_codes(parts, options, [part.num_rows for part in read])
    return {s: [part.take(c == i) for part, c in zip(read, codes, strict=True)]
            for i, s in enumerate(SPLITS)}  # fmt: skip


def _reference(parts, options, vocabs=None):
    """Whole files in memory: ``parts`` is ``[(path, mode)]`` in plan order."""
    chosen = _chosen(parts, options)
    vocabs = vocabs or [
        Vocabulary.fit(
            *merge_counts([count_values(p.categorical[f]) for p in chosen["train"]]),
            options.min_frequency,
            options.max_vocab_size,
        )  # fmt: skip
        for f in range(26)
    ]
    out = {}
    for s in SPLITS:
        ps = chosen[s]
        sparse = np.stack([np.concatenate([v.encode(p.categorical[f]) for p in ps])
                           for f, v in enumerate(vocabs)], axis=1)  # fmt: skip
        out[s] = (np.concatenate([p.dense for p in ps]), sparse,
                  np.concatenate([p.label for p in ps]))  # fmt: skip
    return vocabs, out


def _cached(dm):
    out = {}
    for s in SPLITS:
        table = dm.split_table(s)
        dense = np.asarray(table.column("dense").combine_chunks().flatten()).reshape(-1, 13)
        sparse = np.asarray(table.column("sparse").combine_chunks().flatten()).reshape(-1, 26)
        out[s] = (dense, sparse, table.column("label").to_numpy())
    return out


def _layout(tmp_path, rows, kind):
    root = tmp_path / kind
    if kind in ("plain", "gzip", "hashed"):
        path = write_criteo_tsv(root / ("data.txt.gz" if kind == "gzip" else "data.txt"), rows)
        return str(path), [(str(path), "random")]
    if kind == "named":
        names = ["train_0.txt", "train_1.txt.gz", "val.txt", "test.txt"]
        cuts = [0, 1200, 2000, 2500, 3000]
        paths = [write_criteo_tsv(root / n, _slice(rows, a, b))
                 for n, a, b in zip(names, cuts, cuts[1:], strict=False)]  # fmt: skip
        modes = ["train", "train", "val", "test"]
        return str(root), [(str(p), m) for p, m in zip(paths, modes, strict=True)]
    if kind == "kaggle":
        train = write_criteo_tsv(root / "train.txt", rows)
        write_criteo_tsv(root / "test.txt", _slice(rows, 0, 500), with_label=False)
        return str(root), [(str(train), "random")]
    names = ["day_0.gz", "day_1", "day_2.gz", "day_10"]  # natural order: day_10 last
    cuts = [0, 900, 1500, 2100, 3000]
    paths = [write_criteo_tsv(root / n, _slice(rows, a, b))
             for n, a, b in zip(names, cuts, cuts[1:], strict=False)]  # fmt: skip
    modes = ["train", "train", "train", "halves"]
    return str(root), [(str(p), m) for p, m in zip(paths, modes, strict=True)]


@pytest.mark.parametrize("use_spill", [True, False])
@pytest.mark.parametrize("kind", ["plain", "gzip", "named", "kaggle", "days", "hashed"])
def test_streaming_equals_in_memory(tmp_path, small_rows, monkeypatch, kind, use_spill):
    monkeypatch.setattr(reading, "BLOCK_BYTES", 1 << 14)  # ~60 rows per batch
    monkeypatch.setattr(spill, "spill_fits", lambda paths, directory: use_spill)
    path, parts = _layout(tmp_path, small_rows, kind)
    options = PreprocessOptions(min_frequency=2, shard_rows=700, split_seed=5,
                                max_vocab_size=64 if kind == "hashed" else None)  # fmt: skip
    dm = CriteoDataModule(path, preprocess=options, cache_dir=str(tmp_path / "cache"))
    vocabs, expected = _reference(parts, options)
    got = _cached(dm)
    for s in SPLITS:
        for a, b in zip(got[s], expected[s], strict=True):
            np.testing.assert_array_equal(a, b)
    assert dm.schema.cardinalities == [v.cardinality for v in vocabs]
    hashed = dm.schema.metadata["hashed_fields"]
    assert hashed == [f"C{f + 1}" for f, v in enumerate(vocabs) if v.hashed]
    assert bool(hashed) == (kind == "hashed")
    shards = sorted(p.name for p in (dm.data_dir / "train").iterdir())
    assert len(shards) == math.ceil(len(expected["train"][0]) / 700) + (kind in ("named", "days"))
    assert not list(dm.data_dir.glob(".*"))  # no spill or staging left behind


def test_block_size_does_not_change_the_output(tmp_path, small_rows, monkeypatch):
    path = write_criteo_tsv(tmp_path / "d.txt", small_rows)
    results = []
    for block in (1 << 13, 1 << 22):
        monkeypatch.setattr(reading, "BLOCK_BYTES", block)
        dm = CriteoDataModule(str(path), cache_dir=str(tmp_path / f"c{block}"))
        results.append(_cached(dm))
    for s in SPLITS:
        for a, b in zip(results[0][s], results[1][s], strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["plain", "days"])
def test_given_vocabularies_encode_new_data_and_count_unseen(tmp_path, small_rows, monkeypatch,
                                                             kind):  # fmt: skip
    monkeypatch.setattr(reading, "BLOCK_BYTES", 1 << 14)  # cuts fall inside batches
    old = write_criteo_tsv(tmp_path / "old.txt", _slice(small_rows, 0, 1500))
    fitted = CriteoDataModule(str(old), cache_dir=str(tmp_path / "c"))
    vocabs, _ = _reference([(str(old), "random")], fitted.options)
    given = Vocabularies(dict(zip(CRITEO_CATEGORICAL, vocabs, strict=True)))
    path, parts = _layout(tmp_path, small_rows, kind)
    dm = CriteoDataModule(path, cache_dir=str(tmp_path / "c"))
    dm.use_vocabulary(given)
    assert dm.schema.cardinalities == fitted.schema.cardinalities
    assert dm.schema.metadata["vocabulary_given"] and dm.data_dir != fitted.data_dir
    assert dm.schema.metadata["vocabulary"] == given.fingerprints()
    _, expected = _reference(parts, dm.options, vocabs)
    got = _cached(dm)
    for s in SPLITS:
        np.testing.assert_array_equal(got[s][1], expected[s][1])
    chosen = _chosen(parts, dm.options)
    for s in SPLITS:
        want = {
            f"C{f + 1}": sum(int(((v.encode(p.categorical[f]) == 0)
                                  & (p.categorical[f].codes >= 0)).sum()) for p in chosen[s])
            for f, v in enumerate(vocabs)
        }  # fmt: skip
        assert dm.schema.metadata["unseen_values"][s] == want
        assert sum(want.values()) > 0
    with pytest.raises(ValueError, match="categorical fields"):
        dm.use_vocabulary(Vocabularies({n: given[n] for n in given.names[:2]}))
        dm.schema  # noqa: B018


def test_gzip_by_content_not_name(tmp_path, small_rows):
    plain = write_criteo_tsv(tmp_path / "a.txt", small_rows)
    packed = tmp_path / "b.txt"  # gzip data without the .gz name
    with open(plain, "rb") as f, gzip.open(packed, "wb") as g:
        shutil.copyfileobj(f, g)
    np.testing.assert_array_equal(read_criteo(plain).dense, read_criteo(packed).dense)


@pytest.mark.parametrize("kind", ["plain", "named", "days"])
def test_raw_columns_line_up_with_the_rows_of_each_split(tmp_path, small_rows, kind):
    path, parts = _layout(tmp_path, small_rows, kind)
    dm = CriteoDataModule(path, cache_dir=str(tmp_path / "cache"))
    lines = []
    for p, _ in parts:
        with (gzip.open if p.endswith(".gz") else open)(p, "rt") as f:
            lines.append([line.rstrip("\n").split("\t") for line in f])
    codes = np.concatenate(_split_codes(parts, dm.options, [len(rows) for rows in lines]))
    chosen = _chosen(parts, dm.options)
    for i, s in enumerate(SPLITS):
        got = dm.raw_columns(s, ["C3", "label"])
        rows = [row for rows in lines for row in rows]
        want = [row for row, c in zip(rows, codes, strict=True) if c == i]
        assert got.num_rows == dm.schema.metadata["splits"][s]["rows"] == len(want)
        assert got.column("C3").to_pylist() == [r[16] for r in want]
        assert got.column("label").to_pylist() == [r[0] for r in want]
        assert sum(p.num_rows for p in chosen[s]) == len(want)
