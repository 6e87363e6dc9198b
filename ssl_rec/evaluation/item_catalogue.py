"""The items a retrieval model ranks, and what each user has already seen of them."""

from __future__ import annotations

import torch

from ssl_rec.evaluation.retrieval_metrics import retrieval_metrics
from ssl_rec.types import Batch


class ItemCatalogue:
    """Every candidate item's columns, its id, and the training history of the users.

    Args:
        items: a batch of the item tower's columns, one row per item (``N`` rows).
        item_ids: ``int64[N]`` item id of each row (distinct).
        history: ``int64[P, 2]`` training pairs ``(user id, item id)``, excluded from each
            user's ranking; ``None`` excludes nothing.
        tail: ``bool[N]`` tail items of the catalogue (see
            :func:`~ssl_rec.evaluation.tail_items`), or ``None``.

    """

    def __init__(
        self,
        items: Batch,
        item_ids: torch.Tensor,
        history: torch.Tensor | None = None,
        tail: torch.Tensor | None = None,
    ) -> None:
        n = items.batch_size
        if item_ids.shape != (n,) or torch.unique(item_ids).numel() != n:
            raise ValueError(f"ItemCatalogue: item_ids must be {n} distinct ids, one per item")
        if tail is not None and tail.shape != (n,):
            raise ValueError(f"ItemCatalogue: tail must be bool[{n}], got {tuple(tail.shape)}")
        self.items, self.item_ids, self.tail = items, item_ids.long(), tail
        self._row = torch.full((int(item_ids.max()) + 1,), -1, dtype=torch.long)
        self._row[self.item_ids] = torch.arange(n)
        self._seen: dict[int, torch.Tensor] = {}
        if history is not None:
            users, rows = history[:, 0].long(), self.rows_of(history[:, 1])
            keep = rows >= 0
            users, rows = users[keep], rows[keep]
            order = torch.argsort(users, stable=True)
            ids, counts = torch.unique_consecutive(users[order], return_counts=True)
            for user, part in zip(ids.tolist(), torch.split(rows[order], counts.tolist()),
                                  strict=True):  # fmt: skip
                self._seen[user] = part

    def __len__(self) -> int:
        """``N``, the number of items."""
        return self.items.batch_size

    def rows_of(self, item_ids: torch.Tensor) -> torch.Tensor:
        """``int64[n]`` catalogue row of each id (-1 when the id is not in the catalogue)."""
        ids = item_ids.long().cpu()
        inside = (ids >= 0) & (ids < self._row.numel())
        rows = torch.full_like(ids, -1)
        rows[inside] = self._row[ids[inside]]
        return rows

    def seen(self, user_ids: torch.Tensor) -> torch.Tensor:
        """``bool[B, N]``: the catalogue items in each user's training history."""
        mask = torch.zeros(len(user_ids), len(self), dtype=torch.bool)
        for i, user in enumerate(user_ids.tolist()):
            rows = self._seen.get(user)
            if rows is not None:
                mask[i, rows] = True
        return mask

    def rank(
        self, queries: torch.Tensor, item_vectors: torch.Tensor, user_ids: torch.Tensor,
        positive_ids: torch.Tensor, k: int,
    ) -> dict[str, float]:  # fmt: skip
        """Metrics of one batch of queries, each with one held-out positive item.

        Args:
            queries: ``float32[B, H]`` query vectors.
            item_vectors: ``float32[N, H]`` vectors of the catalogue's rows.
            user_ids: ``int64[B]`` user of each query (for seen-item exclusion).
            positive_ids: ``int64[B]`` held-out item of each query; rows whose item is not in
                the catalogue are left out.
            k: cut-off.

        Returns:
            :func:`~ssl_rec.evaluation.retrieval_metrics` of the batch.

        """
        rows = self.rows_of(positive_ids)
        keep = rows >= 0
        scores = (queries[keep.to(queries.device)] @ item_vectors.T).float().cpu()
        relevant = torch.zeros_like(scores, dtype=torch.bool)
        relevant[torch.arange(int(keep.sum())), rows[keep]] = True
        seen = self.seen(user_ids.cpu()[keep]) & ~relevant
        return retrieval_metrics(scores, relevant, k, seen, self.tail)
