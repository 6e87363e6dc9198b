"""Pieces shared by the contrastive objectives: the NT-Xent loss and the projection head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ssl_rec.metrics import alignment, uniformity
from ssl_rec.objectives._inplace_softmax import log_softmax_nll_, softmax_minus_onehot_
from ssl_rec.types import ObjectiveOutput


class _NTXent(torch.autograd.Function):
    """NT-Xent of normalized views ``z float32[2B, P]`` with one ``[2B, 2B]`` buffer.

    The similarities are masked and turned into log-probabilities in place, and the
    backward turns them into the gradient in place: ``(G + G^T) z / t`` for the gradient
    ``G`` of the loss in the logits (the plain formulation keeps four ``[2B, 2B]`` tensors
    per step and reads each several times).
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor, temperature: float) -> torch.Tensor:  # noqa: ANN001, D102
        n = z.shape[0] // 2
        # 1/t on one operand (rounding aside, the same logits without a pass over them);
        # a contiguous right operand: the product with a transposed view runs slower.
        sim = (z / temperature) @ z.T.contiguous()
        sim.diagonal().fill_(float("-inf"))
        target = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)]).to(z.device)
        loss = log_softmax_nll_(sim, target)
        ctx.log_probs, ctx.target, ctx.temperature = sim, target, temperature
        ctx.save_for_backward(z)
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: ANN001, D102
        (z,) = ctx.saved_tensors
        g = softmax_minus_onehot_(ctx.log_probs, ctx.target)
        ctx.log_probs = None
        # G^T z as (z^T G)^T: both products then read G row by row.
        out = (g @ z).add_((z.T @ g).T)
        return out.mul_(grad / (z.shape[0] * ctx.temperature)), None


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
    return _NTXent.apply(F.normalize(torch.cat([z1, z2]), dim=1), temperature)


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
