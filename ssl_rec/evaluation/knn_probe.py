"""k-nearest-neighbour CTR probe on frozen representations (FAISS exact search).

A test row's click probability is the smoothed mean label of its ``k`` nearest training
rows, ``p = (sum_j y_j + s * prior) / (k + s)``, with ``prior`` the training CTR; the
probe's AUC measures how well the representation's geometry groups rows by click.
"""

from __future__ import annotations

import faiss
import numpy as np

from ssl_rec.evaluation.faiss_index import METRICS, check_metric
from ssl_rec.metrics import binary_auc, binary_logloss


def knn_predict(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    k: int = 50,
    metric: str = "ip",
    normalize: bool = True,
    smoothing: float = 1.0,
) -> np.ndarray:
    """Predicted click probability of each test row: ``float64[m]``.

    Args:
        train_x: ``float32[n, H]`` training representations.
        train_y: ``float[n]`` training labels in {0, 1}.
        test_x: ``float32[m, H]`` test representations.
        k: neighbours (clipped to ``n``).
        metric: ``ip`` (cosine when ``normalize``) or ``l2``.
        normalize: L2-normalise both sides first.
        smoothing: pseudo-count ``s >= 0`` of the training-CTR prior.

    Example:
        >>> x = np.array([[1, 0], [0, 1]], np.float32)
        >>> knn_predict(x, np.array([1.0, 0.0]), x, k=1, smoothing=0.0).tolist()
        [1.0, 0.0]

    """
    check_metric(metric)
    if k < 1:
        raise ValueError(f"knn probe k must be >= 1, got {k}")
    if smoothing < 0:
        raise ValueError(f"knn probe smoothing must be >= 0, got {smoothing}")
    train_x = np.array(train_x, dtype=np.float32, order="C")
    test_x = np.array(test_x, dtype=np.float32, order="C")
    train_y = np.asarray(train_y, dtype=np.float64)
    if train_x.ndim != 2 or test_x.ndim != 2 or train_x.shape[1] != test_x.shape[1]:
        raise ValueError(
            f"train {train_x.shape} and test {test_x.shape} must be [n, H] with equal H"
        )
    if len(train_y) != len(train_x):
        raise ValueError(f"{len(train_y)} training labels for {len(train_x)} training rows")
    if normalize:
        faiss.normalize_L2(train_x)
        faiss.normalize_L2(test_x)
    index = faiss.IndexFlat(train_x.shape[1], METRICS[metric])
    index.add(train_x)
    k = min(k, len(train_x))
    _, nn = index.search(test_x, k)
    prior = float(train_y.mean())
    return (train_y[nn].sum(1) + smoothing * prior) / (k + smoothing)


def knn_probe(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    k: int = 50,
    metric: str = "ip",
) -> dict[str, float]:
    """``{"auc", "logloss"}`` of :func:`knn_predict` against ``test_y float[m]``."""
    prob = knn_predict(train_x, train_y, test_x, k=k, metric=metric)
    return {"auc": binary_auc(prob, test_y), "logloss": binary_logloss(prob, test_y)}
