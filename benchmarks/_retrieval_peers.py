"""Retrieval peers from their own packages on the library's per-user split, and the scoring.

Every model, the library's and the peers, is a function ``users int64[U] -> float32[U, N]``
scoring the whole catalogue for each user; :func:`split_metrics` ranks it with the library's
:func:`~ssl_rec.evaluation.retrieval_metrics` (seen items excluded, tail = the 80% least
popular items of training). Peers see the training positives alone (the user x item matrix,
as ``implicit`` wants it): most-popular, item-kNN (``implicit.nearest_neighbours``'
``CosineRecommender``), ALS (``implicit.cpu.als``) and BPR (``implicit.cpu.bpr``), each with a
small grid chosen on validation recall@10 (``GRIDS``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from ssl_rec.evaluation import retrieval_metrics, tail_items

K = 10
Scorer = Callable[[np.ndarray], np.ndarray]
PEERS = ("most_popular", "item_knn", "implicit_als", "implicit_bpr")
GRIDS: dict[str, list[dict]] = {
    "most_popular": [{}],
    "item_knn": [{"neighbours": n} for n in (20, 50, 100, 200)],
    "implicit_als": [{"factors": f, "regularization": r, "alpha": a}
                     for f in (32, 64) for r in (0.01, 0.1) for a in (1.0, 10.0)],
    "implicit_bpr": [{"factors": f, "learning_rate": lr, "regularization": 0.01}
                     for f in (32, 64) for lr in (0.01, 0.05)],
}  # fmt: skip
ALS_ITERATIONS, BPR_ITERATIONS = 15, 100


@dataclass(frozen=True)
class RetrievalSplit:
    """The per-user split as id arrays.

    Attributes:
        n_users: user ids ``0..n_users-1``.
        items: ``int64[N]`` catalogue item ids (score column ``j`` is ``items[j]``).
        n_item_ids: item ids ``0..n_item_ids-1``.
        train: ``int64[P, 2]`` training positives ``(user, item)``.
        val: ``int64[V, 2]`` the validation positives (one or more per user).
        test: ``int64[T, 2]`` the test positives (one or more per user).
        history: ``int64[H, 2]`` interactions outside validation and test (excluded).
        tail: ``bool[N]`` the 80% least popular catalogue items of ``train``.

    """

    n_users: int
    items: np.ndarray
    n_item_ids: int
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    history: np.ndarray
    tail: np.ndarray

    @classmethod
    def of(cls, dm) -> RetrievalSplit:
        """The split of an ``InteractionTableDataModule`` (e.g. MovieLens-100k's)."""
        schema = dm.schema
        items = dm.catalogue().sparse[:, schema.field_index(dm.item)].numpy()
        n_ids = schema.field(dm.item).cardinality
        train = dm.train_positives().numpy()
        counts = torch.bincount(torch.from_numpy(train[:, 1]), minlength=n_ids)
        return cls(schema.field(dm.user).cardinality, items, n_ids, train,
                   dm.split_positives("val").numpy(), dm.split_positives("test").numpy(),
                   dm.history().numpy(), tail_items(counts[items], 0.8).numpy())  # fmt: skip

    def user_items(self) -> sp.csr_matrix:
        """``float32[n_users, n_item_ids]`` binary training matrix (CSR)."""
        data = np.ones(len(self.train), np.float32)
        m = sp.csr_matrix((data, (self.train[:, 0], self.train[:, 1])),
                          shape=(self.n_users, self.n_item_ids))  # fmt: skip
        m.data[:] = 1.0  # a repeated pair counts once
        return m


def split_metrics(scores: np.ndarray, split: RetrievalSplit, which: str) -> dict[str, float]:
    """``recall_at_10``, ``ndcg_at_10``, ``tail_recall_at_10`` of ``scores`` on ``which``.

    Args:
        scores: ``float32[V, N]`` for the user of each row of ``split.val`` or ``split.test``,
            in order; each row's positive is ranked among the items its user has not seen
            (micro-averaged over held-out positives).
        split: the split.
        which: ``val`` or ``test``. Each user's history is excluded; on ``test`` its
            validation item too (it is known by then).

    """
    pairs = split.val if which == "val" else split.test
    column = np.full(split.n_item_ids, -1)
    column[split.items] = np.arange(len(split.items))
    known = np.concatenate([split.history] + ([split.val] if which == "test" else []))
    c = column[known[:, 1]]
    known_by_user = np.zeros((split.n_users, len(split.items)), dtype=bool)
    known_by_user[known[c >= 0, 0], c[c >= 0]] = True
    # one ranking per held-out positive: a user with several ranks once for each of them
    seen = known_by_user[pairs[:, 0]]
    relevant = np.zeros(scores.shape, dtype=bool)
    relevant[np.arange(len(pairs)), column[pairs[:, 1]]] = True
    seen &= ~relevant
    got = retrieval_metrics(torch.from_numpy(np.asarray(scores, np.float32)),
                            torch.from_numpy(relevant), K, torch.from_numpy(seen),
                            torch.from_numpy(split.tail))  # fmt: skip
    return {f"recall_at_{K}": got[f"recall@{K}"], f"ndcg_at_{K}": got[f"ndcg@{K}"],
            f"tail_recall_at_{K}": got[f"tail_recall@{K}"]}  # fmt: skip


def unavailable() -> str | None:
    """Why the ``implicit`` peers cannot run here, or ``None``."""
    if importlib.util.find_spec("implicit") is None:
        return "implicit is not installed (pip install --no-deps implicit==0.7.3)"
    return None


def peer_scorer(name: str, split: RetrievalSplit, params: dict, seed: int) -> Scorer:
    """Fit peer ``name`` with ``params`` on the training matrix; its catalogue scorer."""
    user_items = split.user_items()
    if name == "most_popular":
        counts = np.asarray(user_items.sum(0)).ravel()[split.items].astype(np.float32)
        return lambda users: np.broadcast_to(counts, (len(users), len(counts))).copy()
    if name == "item_knn":
        from implicit.nearest_neighbours import CosineRecommender

        model = CosineRecommender(K=params["neighbours"], num_threads=1)
        model.fit(user_items, show_progress=False)
        similarity = model.similarity.tocsc()[:, split.items]
        return lambda users: np.asarray((user_items[users] @ similarity).todense(), np.float32)
    if name == "implicit_als":
        from implicit.cpu.als import AlternatingLeastSquares

        model = AlternatingLeastSquares(
            factors=params["factors"], regularization=params["regularization"],
            alpha=params["alpha"], iterations=ALS_ITERATIONS, random_state=seed, num_threads=1,
        )  # fmt: skip
    elif name == "implicit_bpr":
        from implicit.cpu.bpr import BayesianPersonalizedRanking

        model = BayesianPersonalizedRanking(
            factors=params["factors"], learning_rate=params["learning_rate"],
            regularization=params["regularization"], iterations=BPR_ITERATIONS,
            random_state=seed, num_threads=1,
        )  # fmt: skip
    else:
        raise ValueError(f"unknown peer {name!r}; peers are {PEERS}")
    model.fit(user_items, show_progress=False)
    users_f, items_f = np.asarray(model.user_factors), np.asarray(model.item_factors)
    return lambda users: (users_f[users] @ items_f[split.items].T).astype(np.float32)


def evaluate(scorer: Scorer, split: RetrievalSplit) -> dict[str, dict[str, float]]:
    """``{"val": metrics, "test": metrics}`` of a catalogue scorer."""
    return {which: split_metrics(scorer(pairs[:, 0]), split, which)
            for which, pairs in (("val", split.val), ("test", split.test))}  # fmt: skip
