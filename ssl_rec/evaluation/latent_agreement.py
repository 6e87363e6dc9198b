"""Agreement of learned entity neighbours with the true neighbours of synthetic data.

On synthetic data each id of a field has a true latent vector ``v = centroid + noise``; a
good embedding puts ids with similar latents near each other. With ``clusters`` given, an
id's true neighbours are the candidate ids of its latent cluster: the data reveal which
cluster an id belongs to (through co-occurrence and clicks) but not the tiny within-cluster
noise, so the exact latent top-k is not identifiable and would cap every model near
``k / cluster size``. Without clusters, the true neighbours are the ``k`` nearest latents.
Candidates are the frequent ids (rare ids get few updates and add noise).
"""

from __future__ import annotations

import faiss
import numpy as np

from ssl_rec.metrics import ann_recall_at_k


def _cosine_neighbors(vectors: np.ndarray, k: int) -> np.ndarray:
    x = np.array(vectors, dtype=np.float32, order="C")
    faiss.normalize_L2(x)
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    _, nn = index.search(x, k + 1)
    # Drop each query itself (normally column 0; ties may move it).
    out = np.empty((len(x), k), np.int64)
    for i, row in enumerate(nn):
        out[i] = row[row != i][:k]
    return out


def latent_neighbor_recall(
    learned: np.ndarray,
    latents: np.ndarray,
    ids: np.ndarray,
    k: int = 10,
    clusters: np.ndarray | None = None,
) -> float:
    """Recall@k of true latent neighbours among learned-embedding neighbours.

    Args:
        learned: ``float32[card, D]`` learned vector of every id of a field.
        latents: ``float32[card, L]`` true latent vector of every id.
        ids: ``int[m]`` candidate ids (``m > k``), e.g. the most frequent ones.
        k: neighbours per id.
        clusters: ``int[card]`` latent cluster of every id, or ``None``.

    Returns:
        Mean over the ``m`` ids of the fraction of true neighbours among the learned top-k
        (``|learned top-k ∩ true| / min(k, |true|)``; 1 = perfect, about ``k / m`` or the
        cluster share for random embeddings).

    """
    ids = np.asarray(ids, dtype=np.int64)
    if len(learned) != len(latents):
        raise ValueError(f"learned has {len(learned)} rows but latents {len(latents)}")
    if len(ids) <= k:
        raise ValueError(f"need more than k={k} candidate ids, got {len(ids)}")
    found = _cosine_neighbors(learned[ids], k)
    if clusters is None:
        return ann_recall_at_k(found, _cosine_neighbors(latents[ids], k), k)
    cand = np.asarray(clusters)[ids]
    hits = cand[found] == cand[:, None]
    peers = np.bincount(cand - cand.min())[cand - cand.min()] - 1
    usable = peers > 0
    if not usable.any():
        raise ValueError("no candidate id shares its latent cluster with another candidate")
    return float((hits.sum(1)[usable] / np.minimum(k, peers[usable])).mean())


def frequent_ids(
    sparse: np.ndarray, field_index: int, top: int = 1000, min_count: int = 5
) -> np.ndarray:
    """Return the ``top`` most frequent non-missing ids seen at least ``min_count`` times.

    Args:
        sparse: ``int[N, F]`` ids of ``N`` training rows.
        field_index: column of the field.
        top: at most this many ids.
        min_count: minimum count.

    """
    counts = np.bincount(np.asarray(sparse)[:, field_index])
    counts[0] = 0
    order = np.argsort(-counts, kind="stable")[:top]
    return np.sort(order[counts[order] >= min_count])
