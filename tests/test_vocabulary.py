import numpy as np
import pyarrow as pa
import pytest

from ssl_rec.vocab import (
    CodedColumn,
    Vocabulary,
    frequency_order,
    hash_strings,
    key_strings,
    string_keys,
)

VALUES = [
    "",
    "a",
    "ab",
    "ab\x00",
    "0123456",
    "05db9164",
    "68fd1e64",
    "ééé",
    "longer than 8",
    "x" * 30,
]


def test_string_keys_are_exact_for_short_strings_and_invert():
    keys, exact = string_keys(pa.array(VALUES))
    assert exact.tolist() == [True] * 8 + [False, False]
    assert len(set(keys[exact].tolist())) == 8  # "ab" and "ab\0" differ by their length tag
    assert key_strings(keys[exact]).to_pylist() == VALUES[:8]
    assert keys[5] == int.from_bytes(b"05db9164", "little")
    sliced = pa.array(VALUES).slice(4, 3)
    np.testing.assert_array_equal(string_keys(sliced)[0], keys[4:7])
    large = pa.array(VALUES, pa.large_string())
    np.testing.assert_array_equal(string_keys(large)[0][exact], keys[exact])


def test_hash_is_stable_and_independent_of_the_array():
    h = hash_strings(pa.array(VALUES))
    assert len(set(h.tolist())) == len(VALUES)
    again = hash_strings(pa.array(VALUES[::-1]))[::-1]
    np.testing.assert_array_equal(h, again)
    assert int(hash_strings(pa.array(["05db9164"]))[0]) == _splitmix64(
        int.from_bytes(b"05db9164", "little")
    )


def _splitmix64(x):
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def test_frequency_order_ties_by_value_on_both_paths():
    values = pa.array(["b", "a", "ab", "c", "a\x00"])
    counts = np.array([2, 2, 5, 1, 2])
    order = frequency_order(values, counts)
    assert values.take(pa.array(order)).to_pylist() == ["ab", "a", "a\x00", "b", "c"]
    longer = pa.array(["bbbbbbbbbb", "a", "ab", "c", "aaaaaaaaaa"])
    order = frequency_order(longer, counts)
    assert longer.take(pa.array(order)).to_pylist() == ["ab", "a", "aaaaaaaaaa", "bbbbbbbbbb", "c"]


def test_fit_keeps_the_reserved_id_and_hashes_big_fields():
    values, counts = pa.array(["x", "y", "z"]), np.array([1, 1, 0])
    rare = Vocabulary.fit(values, counts, min_frequency=4)
    assert rare.cardinality == 2 and len(rare.values) == 0
    assert rare.id_values().to_pylist() == ["<missing>", "<unused>"]
    exact = Vocabulary.fit(values, counts, max_vocab_size=3)  # 2 seen values fit in 3 ids
    assert not exact.hashed and exact.values.to_pylist() == ["x", "y"]
    hashed = Vocabulary.fit(values, np.array([1, 1, 1]), max_vocab_size=3)
    assert hashed.hashed and hashed.cardinality == 3
    column = CodedColumn.from_column(pa.array(["x", None, "never seen"]))
    ids = hashed.encode(column)
    assert ids[1] == 0 and 1 <= ids[0] <= 2 and 1 <= ids[2] <= 2
    assert hashed.id_values().to_pylist() == ["<missing>", "<hashed>", "<hashed>"]
    with pytest.raises(ValueError, match="cardinality >= 2"):
        Vocabulary.hashed_buckets(1)
