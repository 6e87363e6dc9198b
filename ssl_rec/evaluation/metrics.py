"""Retrieval and representation-geometry metrics, as pure functions of arrays.

Alignment and uniformity follow Wang & Isola, "Understanding Contrastive Representation
Learning through Alignment and Uniformity on the Hypersphere", ICML 2020,
https://arxiv.org/abs/2005.10242 (Eq. 4 and 5, on L2-normalised vectors).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def _relevance(
    retrieved: np.ndarray, positives: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    retrieved = np.asarray(retrieved)
    positives = np.asarray(positives)
    if positives.ndim == 1:
        positives = positives[:, None]
    if retrieved.ndim != 2 or len(retrieved) != len(positives):
        raise ValueError(
            f"retrieved must be [n, K] and positives [n] or [n, P]; got {retrieved.shape} "
            f"and {positives.shape}"
        )
    if k < 1 or k > retrieved.shape[1]:
        raise ValueError(f"k={k} must be in 1..{retrieved.shape[1]} (columns of retrieved)")
    top = retrieved[:, :k]
    valid = positives >= 0
    rel = (top[:, :, None] == positives[:, None, :]) & valid[:, None, :]
    return rel.any(-1), valid.sum(1)


def recall_at_k(retrieved: np.ndarray, positives: np.ndarray, k: int) -> float:
    """Mean over queries of (positives in the top ``k``) / (number of positives).

    Args:
        retrieved: ``int[n, K]`` ranked ids per query (``K >= k``).
        positives: ``int[n]`` one positive id per query, or ``int[n, P]`` padded with -1.
        k: cut-off.

    Example:
        >>> recall_at_k(np.array([[3, 1], [2, 0]]), np.array([1, 5]), 2)
        0.5

    """
    hits, n_pos = _relevance(retrieved, positives, k)
    return float(np.mean(hits.sum(1) / np.maximum(n_pos, 1)))


def ndcg_at_k(retrieved: np.ndarray, positives: np.ndarray, k: int) -> float:
    """Normalised discounted cumulative gain at ``k`` with binary relevance.

    ``DCG = sum_r rel_r / log2(r + 2)`` over ranks ``r = 0..k-1``; the ideal DCG places
    ``min(P, k)`` positives first. Shapes as in :func:`recall_at_k`.

    Example:
        >>> round(ndcg_at_k(np.array([[3, 1]]), np.array([1]), 2), 4)
        0.6309

    """
    hits, n_pos = _relevance(retrieved, positives, k)
    discounts = 1.0 / np.log2(np.arange(k) + 2.0)
    dcg = (hits * discounts).sum(1)
    ideal = np.array([discounts[: min(int(p), k)].sum() for p in n_pos])
    return float(np.mean(np.where(ideal > 0, dcg / np.maximum(ideal, 1e-12), 0.0)))


def ann_recall_at_k(approx: np.ndarray, exact: np.ndarray, k: int) -> float:
    """Fraction of the exact top-``k`` ids that the approximate search also returns.

    Args:
        approx: ``int[n, >=k]`` ids from the approximate index.
        exact: ``int[n, >=k]`` ids from exact search.
        k: cut-off.

    Example:
        >>> ann_recall_at_k(np.array([[1, 2]]), np.array([[2, 3]]), 2)
        0.5

    """
    approx, exact = np.asarray(approx)[:, :k], np.asarray(exact)[:, :k]
    if approx.shape != exact.shape:
        raise ValueError(f"approx {approx.shape} and exact {exact.shape} must match at k={k}")
    hits = (approx[:, :, None] == exact[:, None, :]).any(-1).sum(1)
    return float(np.mean(hits / k))


def alignment(x: torch.Tensor, y: torch.Tensor, alpha: float = 2.0) -> float:
    """Alignment loss ``E ||f(x) - f(y)||^alpha`` over positive pairs (lower is better).

    Args:
        x: ``float32[n, d]`` one view of each item; L2-normalised here.
        y: ``float32[n, d]`` the positive view of each item.
        alpha: exponent (> 0), 2 in the paper.

    """
    if x.shape != y.shape or x.dim() != 2:
        raise ValueError(
            f"alignment needs two [n, d] tensors of one shape, got {x.shape}, {y.shape}"
        )
    x, y = F.normalize(x.float(), dim=1), F.normalize(y.float(), dim=1)
    return float((x - y).norm(dim=1).pow(alpha).mean())


def uniformity(x: torch.Tensor, t: float = 2.0) -> float:
    """Uniformity loss ``log E exp(-t ||f(x) - f(y)||^2)`` over distinct pairs (lower is better).

    Args:
        x: ``float32[n, d]`` (``n >= 2``); L2-normalised here.
        t: temperature (> 0), 2 in the paper.

    """
    if x.dim() != 2 or len(x) < 2:
        raise ValueError(f"uniformity needs [n, d] with n >= 2, got {tuple(x.shape)}")
    x = F.normalize(x.float(), dim=1)
    return float(torch.pdist(x, p=2).pow(2).mul(-t).exp().mean().log())
