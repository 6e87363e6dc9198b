"""The retrieval benchmark's scoring and peers: seen items out, validation item out on test."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is a package at the repository root
    sys.path.insert(0, str(ROOT))

from benchmarks._retrieval_peers import RetrievalSplit, peer_scorer, split_metrics  # noqa: E402

USERS, ITEMS, CLUSTERS = 12, 30, 3  # ids 1..; item i belongs to cluster i % 3


def clustered_split() -> RetrievalSplit:
    """Each user likes the items of its cluster: 6 in training, one validation, one test."""
    train, val, test, history = [], [], [], []
    for u in range(1, USERS + 1):
        liked = [i for i in range(1, ITEMS + 1) if i % CLUSTERS == u % CLUSTERS]
        liked = liked[u % 4 :] + liked[: u % 4]  # users see their cluster in other orders
        train += [(u, i) for i in liked[:6]]
        val.append((u, liked[6]))
        test.append((u, liked[7]))
    history = train
    counts = np.bincount([i for _, i in train], minlength=ITEMS + 1)[1:]
    tail = np.zeros(ITEMS, dtype=bool)
    tail[np.argsort(counts, kind="stable")[: round(0.8 * ITEMS)]] = True
    return RetrievalSplit(USERS + 1, np.arange(1, ITEMS + 1), ITEMS + 1, np.array(train),
                          np.array(val), np.array(test), np.array(history), tail)  # fmt: skip


def test_split_metrics_exclude_history_and_on_test_the_validation_item() -> None:
    split = clustered_split()
    # Score every user's validation item first, its test item second, seen items above all.
    scores = np.zeros((USERS, ITEMS), np.float32)
    for row, (u, i) in enumerate(split.val):
        scores[row, [j - 1 for uu, j in split.history if uu == u]] = 10.0
        scores[row, i - 1], scores[row, split.test[row, 1] - 1] = 3.0, 2.0
    on_val = split_metrics(scores, split, "val")
    assert on_val["recall_at_10"] == 1.0 and on_val["ndcg_at_10"] == 1.0  # seen items removed
    on_test = split_metrics(scores, split, "test")
    assert on_test["recall_at_10"] == 1.0 and on_test["ndcg_at_10"] == 1.0  # val item removed
    # Without a history the six seen items rank first: the validation item is 7th.
    bare = RetrievalSplit(*[np.zeros((0, 2), np.int64) if f == "history" else getattr(split, f)
                            for f in RetrievalSplit.__dataclass_fields__])  # fmt: skip
    assert split_metrics(scores, bare, "val")["ndcg_at_10"] == pytest.approx(1 / np.log2(8))


def test_split_metrics_rank_each_of_a_users_held_out_positives() -> None:
    split = clustered_split()
    # Two validation positives per user (its validation and test items), one score row each.
    two = np.concatenate([split.val, split.test])
    split = RetrievalSplit(*[two if f == "val" else getattr(split, f)
                             for f in RetrievalSplit.__dataclass_fields__])  # fmt: skip
    scores = np.zeros((len(two), ITEMS), np.float32)
    for row, (u, i) in enumerate(two):
        scores[row, [j - 1 for uu, j in split.history if uu == u]] = 10.0  # seen: excluded
        first, second = (i, None) if row < USERS else (None, i)
        if first is not None:
            scores[row, first - 1] = 3.0  # ranked 1st among the unseen
        else:
            scores[row, :] += np.arange(ITEMS, dtype=np.float32) * 1e-3  # ties broken by id
            scores[row, second - 1] = -1.0  # ranked last: a miss
    got = split_metrics(scores, split, "val")
    # each user's history is excluded from both of its rows: one hit in two
    assert got["recall_at_10"] == pytest.approx(0.5) and got["ndcg_at_10"] == pytest.approx(0.5)


def test_most_popular_scores_are_training_counts() -> None:
    split = clustered_split()
    scores = peer_scorer("most_popular", split, {}, 0)(np.array([1, 2]))
    counts = np.bincount(split.train[:, 1], minlength=ITEMS + 1)[1:]
    assert scores.shape == (2, ITEMS) and np.array_equal(scores[0], counts) and (
        np.array_equal(scores[1], counts))  # fmt: skip


@pytest.mark.skipif(importlib.util.find_spec("implicit") is None, reason="needs implicit")
@pytest.mark.parametrize(
    ("name", "params"),
    [("item_knn", {"neighbours": 10}),
     ("implicit_als", {"factors": 8, "regularization": 0.01, "alpha": 10.0}),
     ("implicit_bpr", {"factors": 8, "learning_rate": 0.05, "regularization": 0.01})],
)  # fmt: skip
def test_peers_from_implicit_learn_the_clusters(name: str, params: dict) -> None:
    split = clustered_split()
    users = split.val[:, 0]
    scores = peer_scorer(name, split, params, 0)(users)
    assert scores.shape == (USERS, ITEMS)
    same = (np.arange(1, ITEMS + 1)[None, :] % CLUSTERS) == (users[:, None] % CLUSTERS)
    # The user's own cluster scores above the other clusters on average, for every user.
    assert ((scores * same).sum(1) / same.sum(1) > (scores * ~same).sum(1) / (~same).sum(1)).all()
    if name != "implicit_bpr":  # BPR's SGD on 72 pairs is too noisy for a recall bound
        assert split_metrics(scores, split, "val")["recall_at_10"] >= 0.75
