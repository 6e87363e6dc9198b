"""Exact binary AUC and log loss in numpy, for the oracle metrics of synthetic data."""

from __future__ import annotations

import numpy as np


def binary_auc(score: np.ndarray, label: np.ndarray) -> float:
    """Area under the ROC curve, exact, ties counted as one half.

    Args:
        score: ``float[N]`` predicted scores (any monotone scale).
        label: ``[N]`` binary labels in {0, 1}.

    Returns:
        AUC in [0, 1]; ``nan`` when only one class is present.

    Example:
        >>> binary_auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1]))
        0.75

    """
    label = np.asarray(label).astype(bool)
    n_pos = int(label.sum())
    n_neg = label.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    _, inverse, counts = np.unique(np.asarray(score), return_inverse=True, return_counts=True)
    # Average rank of each distinct score (1-based) handles ties exactly.
    avg_rank = np.cumsum(counts) - (counts - 1) / 2.0
    rank_sum = avg_rank[inverse][label].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def binary_logloss(prob: np.ndarray, label: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy in nats of probabilities ``prob float[N]`` vs ``label [N]``."""
    p = np.clip(np.asarray(prob, np.float64), eps, 1.0 - eps)
    y = np.asarray(label, np.float64)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def oracle_metrics(prob: np.ndarray, label: np.ndarray) -> dict[str, float]:
    """``{"auc", "logloss", "ctr"}`` of the true click probabilities against sampled labels."""
    return {
        "auc": binary_auc(prob, label),
        "logloss": binary_logloss(prob, label),
        "ctr": float(np.mean(label)),
    }
