"""Representation health: is the pooled vector collapsing? Effective rank, alignment, uniformity.

A representation can score a fine AUC while most of its dimensions carry nothing (dimensional
collapse) or while every row maps to nearly one point (complete collapse). Three numbers make
that visible beside AUC:

- effective rank (Roy & Vetterli, "The effective rank: a measure of effective
  dimensionality", EUSIPCO 2007): ``exp`` of the Shannon entropy of the normalised singular
  values of the ``[n, H]`` matrix of pooled vectors; 1 for vectors on one line, ``H`` for
  singular values all equal (isotropic vectors with ``n >> H``);
- alignment and uniformity of Wang & Isola (ICML 2020; :func:`ssl_rec.metrics.alignment`,
  :func:`ssl_rec.metrics.uniformity`): the mean squared distance between two views of a row
  (two independent random field masks) and the log mean Gaussian potential of distinct rows on
  the unit sphere. A collapsed representation has alignment near 0 *and* uniformity near 0 (its
  maximum); a spread one has uniformity well below 0 (about ``-4`` on a high-dimensional sphere).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from ssl_rec.evaluation.representations import backbone_of
from ssl_rec.metrics import alignment, uniformity
from ssl_rec.types import Batch

__all__ = ["effective_rank", "representation_health"]

_CPU = torch.device("cpu")  # the masks' generator: the same masks on any device


def effective_rank(vectors: np.ndarray | torch.Tensor, center: bool = False) -> float:
    """Effective rank of ``n`` vectors (Roy & Vetterli 2007).

    ``p_k = s_k / sum(s)`` over the singular values ``s`` of the matrix; the effective rank is
    ``exp(-sum p_k log p_k)``, a real number in ``[1, min(n, H)]``.

    Args:
        vectors: ``float[n, H]``, one row per vector.
        center: subtract the mean vector first (the rank of the spread around the mean,
            not counting the common offset direction).

    Returns:
        The effective rank; ``0.0`` for an all-zero matrix (no direction at all).

    Raises:
        ValueError: ``vectors`` is not a 2-D array with at least one row, or is not finite.

    Example:
        >>> round(effective_rank(np.outer(np.arange(1.0, 6.0), [1.0, 2.0, 3.0])), 6)
        1.0
        >>> round(effective_rank(np.eye(4)), 6)
        4.0

    """
    x = torch.as_tensor(vectors).detach().double()
    if x.dim() != 2 or len(x) == 0:
        raise ValueError(f"effective_rank needs [n, H] vectors with n >= 1, got {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise ValueError("effective_rank got non-finite vectors")
    if center:
        x = x - x.mean(0, keepdim=True)
    s = torch.linalg.svdvals(x)
    total = s.sum()
    if total <= 0:
        return 0.0
    p = s[s > 0] / total
    return float(torch.exp(-(p * p.log()).sum()))


@torch.no_grad()
def representation_health(
    model: torch.nn.Module,
    batches: Iterable[Batch],
    max_rows: int = 2048,
    mask_prob: float = 0.2,
    seed: int = 0,
) -> dict[str, float]:
    """Collapse indicators of the pooled vector of ``model`` on up to ``max_rows`` rows.

    The backbone runs in eval mode (restored afterwards). Each row is seen three times: as
    is (effective rank and uniformity) and under two independent random field masks, each
    field hidden with probability ``mask_prob`` (the positive pair of alignment).

    Args:
        model: a Backbone or a module with ``.backbone`` (CTRModule, PretrainModule).
        batches: e.g. a validation ``DataLoader`` of :class:`~ssl_rec.types.Batch`.
        max_rows: rows used (the first ones of ``batches``).
        mask_prob: per-field masking probability of each view, in ``(0, 1)``.
        seed: seed of the masks.

    Returns:
        ``rows`` (used), ``dim`` (``H``), ``effective_rank``, ``effective_rank_centered``,
        ``alignment`` (in ``[0, 4]``, lower: views agree), ``uniformity`` (``<= 0``, lower:
        spread out).

    Raises:
        ValueError: fewer than 2 rows, or ``mask_prob`` outside ``(0, 1)``.

    """
    if not 0.0 < mask_prob < 1.0:
        raise ValueError(f"representation_health: mask_prob must be in (0, 1), got {mask_prob}")
    backbone = backbone_of(model)
    was_training = backbone.training
    backbone.eval()
    gen = torch.Generator().manual_seed(seed)
    plain, first, second = [], [], []
    seen = 0
    try:
        for batch in batches:
            plain.append(backbone(batch).pooled.float())
            for views in (first, second):
                # drawn as views.random_field_mask draws (evaluation sits below views)
                mask = torch.rand(*batch.sparse.shape, generator=gen, device=_CPU) < mask_prob
                views.append(
                    backbone(batch, field_mask=mask.to(batch.sparse.device)).pooled.float()
                )
            seen += batch.sparse.shape[0]
            if seen >= max_rows:
                break
    finally:
        backbone.train(was_training)
    if seen < 2:
        raise ValueError(f"representation_health needs at least 2 rows, got {seen}")
    x = torch.cat(plain)[:max_rows]
    a, b = torch.cat(first)[:max_rows], torch.cat(second)[:max_rows]
    return {
        "rows": len(x),
        "dim": x.shape[1],
        "effective_rank": effective_rank(x),
        "effective_rank_centered": effective_rank(x, center=True),
        "alignment": float(alignment(a, b)),
        "uniformity": float(uniformity(x, max_rows=max_rows)),
    }
