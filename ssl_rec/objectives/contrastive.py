"""Pieces shared by the contrastive objectives: the NT-Xent loss and the projection head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ssl_rec.metrics import alignment, uniformity
from ssl_rec.types import ObjectiveOutput


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


def nt_xent_output(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> ObjectiveOutput:
    """:func:`nt_xent` of ``z1, z2`` (``float32[B, P]`` each), logging alignment and uniformity."""
    loss = nt_xent(z1, z2, temperature)
    logs = {
        "loss": loss.detach(),
        "alignment": alignment(z1, z2).detach(),
        "uniformity": uniformity(z1.detach(), max_rows=1024),
    }
    return ObjectiveOutput(loss, logs)


class ProjectionHead(nn.Sequential):
    """``Linear -> BatchNorm -> ReLU -> Linear``: the SimCLR projection ``g(h)``.

    Shape:
        ``float32[B, in_dim] -> float32[B, out_dim]``.
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int) -> None:
        super().__init__(
            nn.Linear(in_dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, out_dim)
        )
