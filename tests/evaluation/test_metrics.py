import math

import numpy as np
import pytest
import torch

from ssl_rec.evaluation import (
    frequent_ids,
    knn_predict,
    knn_probe,
    latent_neighbor_recall,
    linear_probe,
)
from ssl_rec.metrics import alignment, ann_recall_at_k, ndcg_at_k, recall_at_k, uniformity


def test_recall_at_k_hand_computed():
    retrieved = np.array([[5, 1, 2], [7, 8, 9], [3, 4, 0]])
    assert recall_at_k(retrieved, np.array([1, 9, 6]), 2) == pytest.approx(1 / 3)
    assert recall_at_k(retrieved, np.array([1, 9, 6]), 3) == pytest.approx(2 / 3)
    multi = np.array([[1, 2], [9, -1], [6, -1]])
    assert recall_at_k(retrieved, multi, 3) == pytest.approx((1.0 + 1.0 + 0.0) / 3)


def test_ndcg_at_k_hand_computed():
    retrieved = np.array([[5, 1, 2], [1, 8, 9]])
    # query 0: positive at rank 1 -> 1/log2(3); query 1: rank 0 -> 1.
    assert ndcg_at_k(retrieved, np.array([1, 1]), 3) == pytest.approx((1 / math.log2(3) + 1) / 2)
    # two positives at ranks 1 and 2, ideal at ranks 0 and 1.
    dcg, ideal = 1 / math.log2(3) + 1 / math.log2(4), 1 + 1 / math.log2(3)
    assert ndcg_at_k(retrieved[:1], np.array([[1, 2]]), 3) == pytest.approx(dcg / ideal)
    with pytest.raises(ValueError, match="k=4"):
        ndcg_at_k(retrieved, np.array([1, 1]), 4)


def test_ann_recall():
    assert ann_recall_at_k(np.array([[1, 2, 3]]), np.array([[3, 4, 1]]), 3) == pytest.approx(2 / 3)


def test_alignment_and_uniformity_hand_computed():
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    y = torch.tensor([[0.0, 3.0], [0.0, 1.0]])
    # normalised: pair 0 distance sqrt(2) -> squared 2; pair 1 identical -> 0.
    assert alignment(x, y) == pytest.approx(1.0)
    # one pair at squared distance 2: log exp(-2 * 2) = -4.
    assert uniformity(x) == pytest.approx(-4.0)
    antipodal = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    assert uniformity(antipodal) == pytest.approx(-8.0)
    with pytest.raises(ValueError):
        uniformity(x[:1])


def test_knn_probe_hand_computed():
    train = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], np.float32)
    y = np.array([1.0, 1.0, 0.0, 1.0])
    test = np.array([[1, 0.05], [0.05, 1]], np.float32)
    # k=2, smoothing s=1, prior 0.75: (2 + 0.75) / 3 and (1 + 0.75) / 3.
    np.testing.assert_allclose(knn_predict(train, y, test, k=2), [2.75 / 3, 1.75 / 3])
    out = knn_probe(train, y, test, np.array([1.0, 0.0]), k=2)
    assert out["auc"] == 1.0 and out["logloss"] > 0
    with pytest.raises(ValueError, match="k must be"):
        knn_predict(train, y, test, k=0)


def test_linear_probe_separable():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.float32)
    out = linear_probe(x[:300], y[:300], x[300:], y[300:])
    assert out["auc"] > 0.99


def test_latent_neighbor_recall_perfect_and_random():
    rng = np.random.default_rng(0)
    latents = rng.normal(size=(200, 8)).astype(np.float32)
    ids = np.arange(1, 200)
    assert latent_neighbor_recall(latents * 3.0, latents, ids, 10) == 1.0
    random = latent_neighbor_recall(rng.normal(size=(200, 8)), latents, ids, 10)
    assert random < 0.2
    sparse = np.array([[1, 0], [1, 0], [2, 0], [0, 0]])
    assert frequent_ids(sparse, 0, top=5, min_count=1).tolist() == [1, 2]


def test_latent_neighbor_recall_by_cluster():
    rng = np.random.default_rng(1)
    clusters = np.repeat(np.arange(10), 20)  # 10 clusters of 20 ids
    centroids = rng.normal(size=(10, 8))
    latents = (centroids[clusters] + 0.01 * rng.normal(size=(200, 8))).astype(np.float32)
    ids = np.arange(200)
    # clustered but with noise unrelated to the latent noise: perfect by cluster
    learned = centroids[clusters] + 0.01 * rng.normal(size=(200, 8))
    assert latent_neighbor_recall(learned, latents, ids, 10, clusters) == 1.0
    # the exact latent top-10 is mostly missed by the same embedding
    assert latent_neighbor_recall(learned, latents, ids, 10) < 0.8
    shuffled = learned[rng.permutation(200)]
    assert latent_neighbor_recall(shuffled, latents, ids, 10, clusters) < 0.3
