"""Low-rank factors of how often two fields' ids occur together, as columns of a linear model.

Which users rate which movies, which shoppers buy which items: the co-occurrence matrix of
two fields' ids says who is alike without a single label. Its truncated SVD (of
``log(1 + count)``) gives each id of either field a ``K``-vector, and a linear model on those
vectors learns from all labeled rows together what a per-id weight learns only from rows of
that id. Counted on every training row a run reads, labeled or not, it is what unlabeled
rows tell a logistic regression: matrix factorization as a generative, label-free step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from ssl_rec.models.id_counts import standardized_over_rows

__all__ = ["CooccurrenceFactors"]

# Subspace iterations of the randomized SVD: enough for the top singular vectors of a
# heavy-tailed count matrix to settle (Halko et al. 2011 recommend 1-2 for a fast decay).
_POWER_ITERATIONS = 4


class CooccurrenceFactors(nn.Module):
    """Standardized rank-``K`` SVD factors of fields ``a`` and ``b``'s co-occurrence counts.

    For ``M[i, j] = log(1 + rows with id i in field a and id j in field b)`` and its truncated
    SVD ``U S V^T``, id ``i`` of field ``a`` maps to ``(U S^1/2)[i]`` and id ``j`` of field
    ``b`` to ``(V S^1/2)[j]``; each of the ``2K`` columns is standardized over the counted rows
    (each row weighs once), so a column's slope is on the scale of a standard normal. Buffers
    hold the factors, so a checkpoint carries them; before :meth:`set_counts` every feature is
    zero. Where a field has fewer than ``K`` ids the remaining columns stay zero.

    Args:
        cardinalities: ids per field (of all ``F`` fields).
        fields: the pair ``(a, b)`` of field indices, ``a != b``.
        rank: ``K >= 1``, factors per field.
        seed: seed of the randomized SVD (the same counts give the same factors).

    Shape:
        ``sparse int64[B, F]`` -> ``float32[B, 2K]`` (field ``a``'s ``K`` columns, then ``b``'s).

    Example:
        >>> factors = CooccurrenceFactors([2, 2], (0, 1), rank=1)
        >>> factors.set_counts(np.array([0, 1]), np.array([0, 1]), np.array([3, 1]))
        >>> factors(torch.tensor([[0, 0], [1, 1]])).abs()  # 3 rows of (0, 0), 1 of (1, 1)
        tensor([[0.5774, 0.5774],
                [1.7321, 1.7321]])

    """

    def __init__(
        self, cardinalities: Sequence[int], fields: tuple[int, int], rank: int, seed: int = 0
    ) -> None:
        super().__init__()
        a, b = (int(f) for f in fields)
        n_fields = len(cardinalities)
        if not (0 <= a < n_fields and 0 <= b < n_fields) or a == b:
            raise ValueError(
                f"CooccurrenceFactors.fields must be two different fields of {n_fields}, "
                f"got {tuple(fields)}"
            )
        if rank < 1:
            raise ValueError(f"CooccurrenceFactors.rank must be >= 1, got {rank}")
        self.fields = (a, b)
        self.rank = int(rank)
        self.seed = int(seed)
        self.sizes = (int(cardinalities[a]), int(cardinalities[b]))
        self.register_buffer("left", torch.zeros(self.sizes[0], self.rank))
        self.register_buffer("right", torch.zeros(self.sizes[1], self.rank))
        self.register_buffer("counted", torch.tensor(False))

    @property
    def fitted(self) -> bool:
        """Whether counts were set (or loaded with the weights)."""
        return bool(self.counted)

    @property
    def width(self) -> int:
        """Columns of the output, ``2K``."""
        return 2 * self.rank

    @torch.no_grad()
    def set_counts(self, left: np.ndarray, right: np.ndarray, count: np.ndarray) -> None:
        """Factor the counts ``count[n]`` of the id pairs ``(left[n], right[n])``.

        Args:
            left: ``int64[N]`` ids of field ``a``.
            right: ``int64[N]`` ids of field ``b``.
            count: ``int64[N]`` rows of each pair (a pair may repeat: its counts add up).

        Raises:
            ValueError: arrays of different lengths, ids outside their field, negative counts.

        """
        left, right, count = (np.asarray(x).reshape(-1) for x in (left, right, count))
        if not len(left) == len(right) == len(count):
            raise ValueError(
                f"co-occurrence counts: {len(left)} left ids, {len(right)} right ids and "
                f"{len(count)} counts"
            )
        for ids, size, name in ((left, self.sizes[0], "left"), (right, self.sizes[1], "right")):
            if len(ids) and (ids.min() < 0 or ids.max() >= size):
                raise ValueError(f"co-occurrence counts: a {name} id outside [0, {size})")
        if len(count) and count.min() < 0:
            raise ValueError("co-occurrence counts are negative")
        rows_a = np.bincount(left, weights=count, minlength=self.sizes[0])
        rows_b = np.bincount(right, weights=count, minlength=self.sizes[1])
        # A pair listed twice adds up before the log (coalesce sums duplicate entries).
        matrix = torch.sparse_coo_tensor(
            torch.as_tensor(np.stack([left, right]), dtype=torch.int64),
            torch.as_tensor(count, dtype=torch.float64),
            self.sizes,
            check_invariants=False,  # the ids were checked above
        ).coalesce()
        matrix.values().log1p_()
        rank = min(self.rank, *self.sizes)
        self.left.zero_()
        self.right.zero_()
        if matrix.values().numel():
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                u, s, v = torch.svd_lowrank(matrix, q=rank, niter=_POWER_ITERATIONS)
            root = s.sqrt()
            self.left[:, :rank] = standardized_over_rows(u * root, rows_a).float()
            self.right[:, :rank] = standardized_over_rows(v * root, rows_b).float()
        self.counted.fill_(True)

    def forward(self, sparse: torch.Tensor) -> torch.Tensor:
        """Each row's factors of its field-``a`` and field-``b`` ids; shapes in the class doc."""
        a, b = self.fields
        return torch.cat([self.left[sparse[:, a]], self.right[sparse[:, b]]], dim=1)
