"""Recall@K / NDCG@K with seen-item exclusion, overall and on tail items, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from ssl_rec.evaluation import retrieval_metrics, tail_items, top_k_unseen

SCORES = torch.tensor(
    [[0.9, 0.8, 0.7, 0.6, 0.5], [0.1, 0.2, 0.3, 0.4, 0.5], [0.5, 0.4, 0.3, 0.2, 0.1]]
)
RELEVANT = torch.tensor(
    [[0, 0, 1, 0, 1], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]], dtype=torch.bool
)  # user 2 has no held-out item: left out of the means
SEEN = torch.zeros(3, 5, dtype=torch.bool)
SEEN[0, 0] = True
NDCG_USER0 = (1 / math.log2(3)) / (1 + 1 / math.log2(3))  # one hit at rank 2 of 2 positives


def test_seen_items_leave_the_ranking() -> None:
    assert top_k_unseen(SCORES, SEEN, 2).tolist() == [[1, 2], [4, 3], [0, 1]]
    assert top_k_unseen(SCORES, None, 2).tolist() == [[0, 1], [4, 3], [0, 1]]


def test_recall_and_ndcg_by_hand() -> None:
    got = retrieval_metrics(SCORES, RELEVANT, k=2, seen=SEEN)
    assert got["users"] == 2
    assert got["recall@2"] == pytest.approx((0.5 + 1.0) / 2)
    assert got["ndcg@2"] == pytest.approx((NDCG_USER0 + 1.0) / 2)
    assert "tail_recall@2" not in got
    # Without the exclusion user 0's top 2 is its seen item and item 1: no hit.
    unseen = retrieval_metrics(SCORES, RELEVANT, k=2)
    assert unseen["recall@2"] == pytest.approx(0.5) and unseen["ndcg@2"] == pytest.approx(0.5)


def test_tail_figures_count_only_tail_positives() -> None:
    tail = torch.tensor([False, False, False, True, True])
    got = retrieval_metrics(SCORES, RELEVANT, k=2, seen=SEEN, tail=tail)
    # User 0's only tail positive (item 4) is not in [1, 2]; user 1 finds item 4 first.
    assert got["tail_users"] == 2
    assert got["tail_recall@2"] == pytest.approx(0.5)
    assert got["tail_ndcg@2"] == pytest.approx(0.5)
    none = retrieval_metrics(SCORES, RELEVANT, k=2, tail=torch.zeros(5, dtype=torch.bool))
    assert none["tail_users"] == 0 and math.isnan(none["tail_recall@2"])


def test_tail_is_the_least_popular_share() -> None:
    assert tail_items(torch.tensor([5, 0, 9, 1, 2]), 0.8).tolist() == [True, True, False, True,
                                                                     True]  # fmt: skip
    assert tail_items(torch.tensor([3, 3, 3]), 0.0).tolist() == [False] * 3


def test_bad_inputs_are_rejected() -> None:
    with pytest.raises(ValueError, match="exceeds the 5 items"):
        top_k_unseen(SCORES, None, 6)
    with pytest.raises(ValueError, match="must match scores"):
        retrieval_metrics(SCORES, RELEVANT[:2], k=2)
    with pytest.raises(ValueError, match=r"tail \(4,\) must be \[N\]"):
        retrieval_metrics(SCORES, RELEVANT, k=2, tail=torch.zeros(4, dtype=torch.bool))
