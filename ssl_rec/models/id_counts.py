"""How often each id occurs in the training rows, as one standardized number per field.

An id's frequency in the logs (a user's activity, an item's popularity) carries over from id
to id: a slope on it is learned from all labeled rows together, where a per-id weight needs
labels of that very id. Counted on every training row a run reads, labeled or not, it is
also what rows without labels tell a supervised model directly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

__all__ = ["IdCountFeatures", "standardized_over_rows"]


class IdCountFeatures(nn.Module):
    """``(log1p(count_f[id]) - mean_f) / std_f`` for the id of every field.

    ``mean_f`` and ``std_f`` are over the counted rows (each row weighs once), so the
    feature is standardized on the data it was counted on. Buffers hold the values, so a
    checkpoint carries them; before :meth:`set_counts` every feature is zero.

    Args:
        cardinalities: ids per field.

    Shape:
        ``sparse int64[B, F]`` -> ``float32[B, F]``.

    Example:
        >>> features = IdCountFeatures([3])
        >>> features.set_counts([np.array([0, 1, 3])])
        >>> features(torch.tensor([[1], [2]]))  # 1 row of id 1, 3 of id 2: mean 0, std 1
        tensor([[-1.7321],
                [ 0.5774]])

    """

    def __init__(self, cardinalities: Sequence[int]) -> None:
        super().__init__()
        cards = torch.tensor([int(c) for c in cardinalities], dtype=torch.int64)
        self.register_buffer("values", torch.zeros(int(cards.sum())))
        self.register_buffer("offsets", torch.cumsum(cards, 0) - cards)
        self.register_buffer("counted", torch.tensor(False))
        self.cardinalities = [int(c) for c in cardinalities]

    @property
    def fitted(self) -> bool:
        """Whether counts were set (or loaded with the weights)."""
        return bool(self.counted)

    @torch.no_grad()
    def set_counts(self, counts: Sequence[np.ndarray | torch.Tensor]) -> None:
        """Set every field's feature from ``counts[f] int64[cardinality_f]`` occurrences.

        Raises:
            ValueError: a field's counts have another length than its cardinality, or are
                negative.

        """
        if len(counts) != len(self.cardinalities):
            raise ValueError(
                f"id counts of {len(counts)} fields for a model of {len(self.cardinalities)}"
            )
        parts = []
        for f, (count, card) in enumerate(zip(counts, self.cardinalities, strict=True)):
            count = torch.as_tensor(np.asarray(count), dtype=torch.float64)
            if count.shape != (card,):
                raise ValueError(
                    f"id counts of field {f}: shape {tuple(count.shape)}, expected ({card},)"
                )
            if bool((count < 0).any()):
                raise ValueError(f"id counts of field {f} are negative")
            parts.append(standardized_over_rows(count.log1p().unsqueeze(1), count)[:, 0].float())
        self.values.copy_(torch.cat(parts))
        self.counted.fill_(True)

    def forward(self, sparse: torch.Tensor) -> torch.Tensor:
        """The standardized log count of each row's id in each field."""
        return self.values[sparse + self.offsets]


def standardized_over_rows(values: torch.Tensor, rows: np.ndarray | torch.Tensor) -> torch.Tensor:
    """``values float64[R, K]`` (one row per id) standardized per column over counted rows.

    Each id weighs as many rows as ``rows[R]`` says, so a column has mean 0 and std 1 over
    the rows it was counted on. No rows at all, or a column constant over them, gives zeros:
    a constant column carries nothing.
    """
    weight = torch.as_tensor(rows, dtype=torch.float64).reshape(-1, 1)
    total = weight.sum()
    if total <= 0:
        return torch.zeros_like(values)
    mean = (weight * values).sum(0) / total
    var = (weight * (values - mean) ** 2).sum(0) / total
    scale = torch.where(var > 1e-12, var.sqrt(), torch.full_like(var, float("inf")))
    return (values - mean) / scale
