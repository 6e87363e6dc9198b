"""Pure functions of the contrastive objectives: NT-Xent, alignment, uniformity."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """Normalized-temperature cross-entropy over ``2B`` views (SimCLR).

    Chen et al., "A Simple Framework for Contrastive Learning of Visual Representations",
    ICML 2020, https://arxiv.org/abs/2002.05709, Eq. 1. Each view's positive is the other
    view of its row; the ``2B - 2`` other views are negatives.

    Args:
        z1: ``float32[B, P]`` projections of the first views (normalized here).
        z2: ``float32[B, P]`` projections of the second views.
        temperature: softmax temperature (> 0).

    Returns:
        scalar loss.

    """
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    sim = z @ z.T / temperature
    n = z1.shape[0]
    sim = sim.masked_fill(torch.eye(2 * n, dtype=torch.bool, device=z.device), float("-inf"))
    target = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
    return F.cross_entropy(sim, target)


def alignment(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """Mean squared distance of normalized positive pairs (lower is better).

    Wang & Isola, "Understanding Contrastive Representation Learning through Alignment and
    Uniformity on the Hypersphere", ICML 2020, https://arxiv.org/abs/2005.10242 (alpha=2).
    """
    return (F.normalize(z1, dim=1) - F.normalize(z2, dim=1)).pow(2).sum(1).mean()


def uniformity(z: torch.Tensor, t: float = 2.0, max_rows: int = 1024) -> torch.Tensor:
    """``log E exp(-t ||zi - zj||^2)`` over pairs of normalized rows (lower is more uniform).

    Wang & Isola 2020 (see :func:`alignment`). Estimated on the first ``max_rows`` rows:
    all pairs of a 4096-row batch (8M distances) cost more than the training step.
    """
    z = F.normalize(z[:max_rows], dim=1)
    return torch.pdist(z).pow(2).mul(-t).exp().mean().log()


class ProjectionHead(nn.Sequential):
    """``Linear -> BatchNorm -> ReLU -> Linear``: the SimCLR projection ``g(h)``.

    Shape:
        ``float32[B, in_dim] -> float32[B, out_dim]``.
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int) -> None:
        super().__init__(
            nn.Linear(in_dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, out_dim)
        )
