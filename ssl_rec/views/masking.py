"""Field masks for the backbone's ``[MASK]`` tokens: random and correlated (CFM).

A mask is ``bool[B, F]``; ``True`` marks fields the backbone replaces by its learned
per-field ``[MASK]`` embedding (see ``ssl_rec.models.FieldEmbedding``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ssl_rec._checks import check_at_least, check_rate
from ssl_rec._config import RecordsConfig


def random_field_mask(
    batch_size: int, n_fields: int, rate: float, rng: torch.Generator, device: torch.device
) -> torch.Tensor:
    """Mask each field of each row independently with probability ``rate``.

    Returns:
        ``bool[B, F]``.

    """
    return torch.rand(batch_size, n_fields, generator=rng, device=device) < rate


def field_mutual_information(sparse: torch.Tensor, buckets: int = 32) -> torch.Tensor:
    """Pairwise mutual information (nats) between fields, from ids hashed into ``buckets``.

    Hashing keeps the joint tables ``buckets x buckets`` for any cardinality; it
    under-estimates MI a little but preserves which fields inform each other.

    Args:
        sparse: ``int64[N, F]`` ids.
        buckets: hash buckets per field.

    Returns:
        ``float32[F, F]`` symmetric MI matrix (diagonal = each field's hashed entropy).

    """
    n, f = sparse.shape
    # Multiplicative hashing spreads consecutive ids (Zipf-popular ones) over buckets.
    hashed = (sparse * 2654435761) % 4294967291 % buckets
    rows, cols = torch.triu_indices(f, f, device=sparse.device)
    pair = torch.arange(rows.numel(), device=sparse.device) * buckets * buckets
    codes = pair + hashed[:, rows] * buckets + hashed[:, cols]
    joint = torch.bincount(codes.flatten(), minlength=rows.numel() * buckets * buckets)
    joint = joint.view(-1, buckets, buckets).double() / n
    pi, pj = joint.sum(2, keepdim=True), joint.sum(1, keepdim=True)
    ratio = torch.where(joint > 0, joint / (pi * pj).clamp_min(1e-300), torch.ones_like(joint))
    mi_pairs = (joint * ratio.log()).sum((1, 2)).float()
    mi = torch.zeros(f, f, device=sparse.device)
    mi[rows, cols] = mi_pairs
    mi[cols, rows] = mi_pairs
    return mi


class RandomFieldMask(RecordsConfig, nn.Module):
    """Mask every field of every row independently with probability ``rate``.

    Args:
        rate: masking probability in [0, 1].

    Example:
        >>> m = RandomFieldMask(0.5)
        >>> m(torch.zeros(4, 6, dtype=torch.long), torch.Generator().manual_seed(0)).shape
        torch.Size([4, 6])

    """

    def __init__(self, rate: float = 0.3) -> None:
        super().__init__()
        self.rate = check_rate("RandomFieldMask", "rate", rate)

    def forward(self, sparse: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
        """``sparse int64[B, F] -> bool[B, F]``."""
        b, f = sparse.shape
        return random_field_mask(b, f, self.rate, rng, sparse.device)


class CorrelatedFieldMask(RecordsConfig, nn.Module):
    """Correlated feature masking: a seed field and the fields most informative about it.

    Masking mutually-informative fields together stops the model from copying a masked
    field from a near-duplicate.

    Yao et al., "Self-supervised Learning for Large-scale Item Recommendations", CIKM 2021,
    https://arxiv.org/abs/2007.12865 (Section 3.3, CFM). The pairwise mutual information is
    estimated from the first ``fit_rows`` rows seen (hashed co-occurrence counts), then frozen.

    Args:
        rate: fraction of fields masked per row, in [0, 1] (the paper uses 0.5).
        buckets: hash buckets per field for the MI estimate.
        fit_rows: rows accumulated before the MI matrix is frozen.

    Shape:
        ``sparse int64[B, F] -> bool[B, F]`` with exactly ``round(rate * F)`` per row.

    """

    def __init__(self, rate: float = 0.5, buckets: int = 32, fit_rows: int = 4096) -> None:
        super().__init__()
        self.rate = check_rate("CorrelatedFieldMask", "rate", rate)
        check_at_least("CorrelatedFieldMask", "buckets", buckets, 2)
        check_at_least("CorrelatedFieldMask", "fit_rows", fit_rows)
        self.buckets, self.fit_rows = int(buckets), int(fit_rows)
        # Not persistent: its shape is only known from data, and re-estimating it after a
        # restart from fresh rows is as good as the saved one.
        self.register_buffer("ranking", torch.empty(0, dtype=torch.long), persistent=False)
        self._seen: list[torch.Tensor] = []

    def forward(self, sparse: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
        """``sparse int64[B, F] -> bool[B, F]``."""
        b, f = sparse.shape
        ranking = self.ranking if self.ranking.numel() else self._accumulate(sparse)
        k = round(self.rate * f)
        seed = torch.randint(0, f, (b,), generator=rng, device=sparse.device)
        mask = torch.zeros(b, f, dtype=torch.bool, device=sparse.device)
        if k:
            mask.scatter_(1, ranking[seed, :k], True)
        return mask

    def _accumulate(self, sparse: torch.Tensor) -> torch.Tensor:
        self._seen.append(sparse.detach())
        pool = torch.cat(self._seen)
        ranking = field_ranking(pool, self.buckets)
        if pool.shape[0] >= self.fit_rows:
            self.ranking = ranking
            self._seen.clear()
        return ranking


def field_ranking(sparse: torch.Tensor, buckets: int = 32) -> torch.Tensor:
    """``int64[F, F]``: row ``s`` lists fields by decreasing MI with field ``s`` (``s`` first)."""
    mi = field_mutual_information(sparse, buckets)
    mi.fill_diagonal_(math.inf)
    return mi.argsort(dim=1, descending=True)
