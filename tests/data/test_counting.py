import numpy as np
import pyarrow as pa
import pytest

from ssl_rec.data import counting
from ssl_rec.data.counting import ValueCounter
from ssl_rec.data.lookup import KeyTable, VocabularyLookup, codes_of, dictionary_counts
from ssl_rec.vocab import CodedColumn, Vocabulary, count_values


def _column(rng, n):
    pool = [f"{i:08x}" for i in range(300)] + [str(i) for i in range(40)]
    pool += [f"a long value number {i}" for i in range(30)]
    picks = rng.zipf(1.3, n) % len(pool)
    values = [pool[i] for i in picks]
    return pa.array([None if i % 11 == 0 else v for i, v in enumerate(values)])


@pytest.mark.parametrize("batch", [7, 64, 5000])
def test_counter_equals_whole_column_counts(monkeypatch, batch):
    monkeypatch.setattr(counting, "MERGE_MIN", 16)  # merge often
    column = _column(np.random.default_rng(0), 5000)
    counter = ValueCounter(None)
    for start in range(0, len(column), batch):
        encoded = column.slice(start, batch).dictionary_encode()
        counter.add(encoded.dictionary, dictionary_counts(encoded))
    values, counts = counter.result()
    got = dict(zip(values.to_pylist(), counts.tolist(), strict=True))
    distinct, expected = count_values(CodedColumn.from_column(column))
    assert got == dict(zip(distinct.to_pylist(), expected.tolist(), strict=True))
    fitted = counter.vocabulary(min_frequency=3)
    reference = Vocabulary.fit(distinct, expected, min_frequency=3)
    assert fitted.values.to_pylist() == reference.values.to_pylist()
    assert fitted.cardinality == reference.cardinality
    assert counter.distinct == 0  # the counts are released once the vocabulary is fitted


def test_counter_overflow_hashes_and_forgets_values(monkeypatch):
    monkeypatch.setattr(counting, "MERGE_MIN", 1)
    counter = ValueCounter(max_vocab_size=10)
    counter.add(pa.array([f"v{i}" for i in range(9)]), np.ones(9))
    assert not counter.overflow
    counter.add(pa.array(["v0", "new"]), np.array([3, 1]))
    counter.flush()
    assert counter.overflow and counter.distinct == 0
    vocab = counter.vocabulary(min_frequency=1)
    assert vocab.hashed and vocab.cardinality == 10


def test_codes_and_counts_of_dictionary_columns():
    column = pa.array(["b", None, "a", "b", None]).dictionary_encode()
    assert codes_of(column).tolist() == [0, -1, 1, 0, -1]
    assert dictionary_counts(column).tolist() == [2, 1]
    rows = np.array([True, True, False, False, False])
    assert dictionary_counts(column, rows).tolist() == [1, 0]
    assert codes_of(column.slice(1, 3)).tolist() == [-1, 1, 0]


def test_key_table_finds_every_key_and_nothing_else():
    rng = np.random.default_rng(1)
    keys = np.unique(rng.integers(0, 2**63, 5000).astype(np.uint64))
    ids = rng.permutation(len(keys)).astype(np.int32) + 1
    table = KeyTable(keys, ids)
    np.testing.assert_array_equal(table.get(keys), ids)
    absent = rng.integers(0, 2**63, 2000).astype(np.uint64)
    absent = absent[~np.isin(absent, keys)]
    assert (table.get(absent) == 0).all()


def test_lookup_matches_vocabulary_encode():
    column = _column(np.random.default_rng(2), 3000)
    distinct, counts = count_values(CodedColumn.from_column(column))
    vocab = Vocabulary.fit(distinct, counts, min_frequency=2)
    other = _column(np.random.default_rng(3), 2000)
    ids, unseen = VocabularyLookup(vocab).encode(other)
    coded = CodedColumn.from_column(other)
    expected = vocab.encode(coded)
    np.testing.assert_array_equal(ids, expected)
    assert unseen == int(((expected == 0) & (coded.codes >= 0)).sum()) > 0
    empty = Vocabulary.fit(distinct, counts, min_frequency=10**6)
    assert (VocabularyLookup(empty).encode(other)[0] == 0).all()
