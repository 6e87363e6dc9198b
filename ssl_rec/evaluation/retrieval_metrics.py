"""Recall@K and NDCG@K of a full-catalogue ranking, overall and on the long tail.

Each user's items of the training history are removed from its ranking before the top ``K``
is taken (seen-item exclusion), so a model is not rewarded for re-recommending them. Users
without a held-out item (or, for the tail figures, without a held-out tail item) are left
out of the mean. The per-ranking formulas are :func:`ssl_rec.metrics.recall_at_k` (hits /
held-out items) and :func:`ssl_rec.metrics.ndcg_at_k` (binary relevance).
"""

from __future__ import annotations

import numpy as np
import torch

from ssl_rec._checks import check_at_least, check_rate
from ssl_rec.metrics import ndcg_at_k, recall_at_k


def tail_items(train_counts: torch.Tensor, fraction: float = 0.8) -> torch.Tensor:
    """``bool[N]``: the ``fraction`` least popular items of the training data.

    Items are ordered by count (ties by id), and the first ``round(fraction * N)`` are the tail.

    Args:
        train_counts: ``int64 | float32[N]`` positives of each item id in training.
        fraction: share of the catalogue that is tail, in ``[0, 1]``.

    Example:
        >>> tail_items(torch.tensor([5, 0, 9, 1, 2]), 0.6)
        tensor([False,  True, False,  True,  True])

    """
    fraction = check_rate("tail_items", "fraction", fraction)
    counts = train_counts.flatten().double()
    order = torch.argsort(counts, stable=True)
    tail = torch.zeros(counts.numel(), dtype=torch.bool)
    tail[order[: round(fraction * counts.numel())]] = True
    return tail


def top_k_unseen(scores: torch.Tensor, seen: torch.Tensor | None, k: int) -> torch.Tensor:
    """``int64[U, k]`` ids of the ``k`` best-scored items of each user, seen items excluded.

    Args:
        scores: ``float32[U, N]`` score of every item for every user.
        seen: ``bool[U, N]`` items of each user's training history, or ``None``.
        k: cut-off, ``1 <= k <= N``.

    """
    k = check_at_least("top_k_unseen", "k", k)
    if k > scores.shape[1]:
        raise ValueError(f"top_k_unseen.k={k} exceeds the {scores.shape[1]} items")
    if seen is not None:
        if seen.shape != scores.shape:
            raise ValueError(f"seen {tuple(seen.shape)} must match scores {tuple(scores.shape)}")
        scores = scores.masked_fill(seen, float("-inf"))
    return torch.topk(scores.float(), k, dim=1).indices


def _positives(relevant: torch.Tensor) -> np.ndarray:
    """``bool[U, N]`` -> ``int64[U, P]`` ids of each row's relevant items, padded with -1."""
    width = max(int(relevant.sum(1).max()), 1) if relevant.numel() else 1
    ranks = torch.argsort((~relevant).to(torch.int8), dim=1, stable=True)[:, :width]
    kept = torch.gather(relevant, 1, ranks)
    return torch.where(kept, ranks, torch.full_like(ranks, -1)).numpy()


def retrieval_metrics(
    scores: torch.Tensor,
    relevant: torch.Tensor,
    k: int = 10,
    seen: torch.Tensor | None = None,
    tail: torch.Tensor | None = None,
) -> dict[str, float]:
    """Recall@K and NDCG@K over users, and the same on tail items.

    Args:
        scores: ``float32[U, N]`` score of every catalogue item for every user.
        relevant: ``bool[U, N]`` held-out positives of each user.
        k: cut-off.
        seen: ``bool[U, N]`` training-history items, excluded from the ranking; ``None``
            ranks everything.
        tail: ``bool[N]`` tail items (:func:`tail_items`); ``None`` skips the tail figures.
            The tail figures rank the whole catalogue and count only tail positives.

    Returns:
        ``{"recall@k", "ndcg@k", "users"}`` and, with ``tail``, ``{"tail_recall@k",
        "tail_ndcg@k", "tail_users"}``; a figure is NaN when no user has a positive.

    Example:
        >>> s = torch.tensor([[0.9, 0.8, 0.1]])
        >>> retrieval_metrics(s, torch.tensor([[False, True, False]]), k=1,
        ...                   seen=torch.tensor([[True, False, False]]))["recall@1"]
        1.0

    """
    if relevant.shape != scores.shape:
        raise ValueError(
            f"relevant {tuple(relevant.shape)} must match scores {tuple(scores.shape)}"
        )
    top = top_k_unseen(scores, seen, k).numpy()
    groups = {"": relevant.bool()}
    if tail is not None:
        if tail.shape != scores.shape[1:]:
            raise ValueError(f"tail {tuple(tail.shape)} must be [N] = [{scores.shape[1]}]")
        groups["tail_"] = relevant.bool() & tail.bool().unsqueeze(0)
    out: dict[str, float] = {}
    for prefix, rel in groups.items():
        users = rel.any(1)
        n = int(users.sum())
        out[f"{prefix}users"] = float(n)
        if n == 0:
            out[f"{prefix}recall@{k}"] = out[f"{prefix}ndcg@{k}"] = float("nan")
            continue
        positives = _positives(rel[users])
        out[f"{prefix}recall@{k}"] = recall_at_k(top[users.numpy()], positives, k)
        out[f"{prefix}ndcg@{k}"] = ndcg_at_k(top[users.numpy()], positives, k)
    return out
