"""The label-headroom benchmark's per-id columns: what the rows say with and without labels."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` is a package at the repository root
    sys.path.insert(0, str(ROOT))

from benchmarks.label_headroom import (  # noqa: E402
    SHRINK_ROWS,
    id_statistics,
    label_rates,
    split_rows,
    summarize,
)


def _rows() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    dense = np.array([[1.0], [3.0], [5.0], [7.0]])
    ids = np.array([[0, 2], [0, 2], [1, 2], [0, 1]])
    label = np.array([1.0, 0.0, 1.0, 1.0])
    return dense, ids, label


def test_split_rows_reads_a_preprocessed_table_in_row_order() -> None:
    table = pa.table({
        "dense": pa.array([[1.0, 2.0], [3.0, 4.0]], pa.list_(pa.float32(), 2)),
        "sparse": pa.array([[5, 6, 7], [8, 9, 10]], pa.list_(pa.int32(), 3)),
        "label": pa.array([0.0, 1.0], pa.float32()),
    })  # fmt: skip
    dense, ids, label = split_rows(table)
    assert dense.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert ids.tolist() == [[5, 6, 7], [8, 9, 10]]
    assert label.tolist() == [0.0, 1.0] and label.flags.writeable


def test_id_statistics_are_count_mean_and_std_of_each_id_without_labels() -> None:
    first, second = id_statistics(_rows(), [3, 3])
    assert first.shape == (3, 3) and second.shape == (3, 3)
    # field 0: id 0 in rows 0, 1, 3 (dense 1, 3, 7); id 1 in row 2; id 2 nowhere
    assert first[0].tolist() == pytest.approx([np.log(4.0), 11 / 3, np.std([1.0, 3.0, 7.0])])
    assert first[1][:2].tolist() == pytest.approx([np.log(2.0), 5.0])
    assert first[1][2] == pytest.approx(np.std([1.0, 3.0, 5.0, 7.0]))  # one row: the overall std
    assert first[2].tolist() == pytest.approx([0.0, 4.0, np.std([1.0, 3.0, 5.0, 7.0])])
    assert second[2][:2].tolist() == pytest.approx([np.log(4.0), 3.0])
    flipped = (*_rows()[:2], 1.0 - _rows()[2])
    assert all(np.array_equal(a, b) for a, b in zip(id_statistics(flipped, [3, 3]),
                                                    [first, second], strict=True))  # fmt: skip


def test_label_rates_shrink_each_id_to_the_overall_rate() -> None:
    first, _ = label_rates(_rows(), [3, 3])
    prior = 0.75
    k = SHRINK_ROWS
    assert first[:, 0].tolist() == pytest.approx([(2 + k * prior) / (3 + k),
                                                  (1 + k * prior) / (1 + k), prior])  # fmt: skip


def test_summary_pairs_each_variant_with_the_labeled_rows_alone() -> None:
    def fit(auc: float) -> dict:
        return {"C": 1.0, "val_auc": auc, "test_auc": auc}

    per_seed = {
        0: {"0.1": {"labeled": fit(0.60), "id_statistics": fit(0.62)}, "1": {"labeled": fit(0.7)}},
        1: {"0.1": {"labeled": fit(0.64), "id_statistics": fit(0.63)}, "1": {"labeled": fit(0.8)}},
    }
    summary = summarize(per_seed)
    gain = summary["0.1"]["paired"]["id_statistics - labeled"]
    assert gain["diffs"] == pytest.approx([0.02, -0.01]) and gain["wins"] == 1
    assert summary["0.1"]["variants"]["labeled"]["mean"] == pytest.approx(0.62)
    assert summary["1"]["paired"] == {}
