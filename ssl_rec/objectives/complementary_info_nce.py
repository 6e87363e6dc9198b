"""Contrast two complementary feature-masked views of each item (Yao et al. 2021)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ssl_rec._checks import check_at_least, check_positive
from ssl_rec.objectives.base import Objective
from ssl_rec.objectives.contrastive import ProjectionHead, nt_xent_output
from ssl_rec.types import BackboneProtocol, Batch, ObjectiveOutput
from ssl_rec.views import CorrelatedFieldMask, View


class ComplementaryInfoNCE(Objective):
    """InfoNCE between two views that mask complementary sets of fields.

    Yao et al., "Self-supervised Learning for Large-scale Item Recommendations", CIKM 2021,
    https://arxiv.org/abs/2007.12865 (Sections 3.2-3.3): one mask ``M`` is drawn per row
    (correlated feature masking: a seed field and the fields most informative about it);
    the first view masks ``M``, the second its complement, so the two views share no field
    and the tower cannot match them by copying one. Both views go through the same tower
    (the backbone given to :meth:`forward`, e.g. a retrieval model's item tower) and, unlike
    :class:`~ssl_rec.objectives.InfoNCE`, are compared as they come out of it (cosine
    similarity over ``temperature``) unless a projection head is asked for.

    Args:
        masking: field masker ``(sparse int64[B, F], rng) -> bool[B, F]``; ``None`` is
            ``CorrelatedFieldMask(0.5)``.
        corruptions: batch corruptions applied before the mask (e.g. ``IdDropout``),
            the same draw for both views.
        temperature: softmax temperature (> 0).
        projection_dim: width of an optional projection head (0: none, the paper's setting).
        hidden: hidden width of the projection head.
        seed: seed of the masks' random stream.
        max_rows: contrast only the batch's first ``max_rows`` rows.

    Shape:
        ``forward(batch of B rows, backbone)``: two ``float32[B, H]`` views, a scalar loss.

    """

    def __init__(
        self,
        masking: nn.Module | None = None,
        corruptions: Sequence[nn.Module] = (),
        temperature: float = 0.1,
        projection_dim: int = 0,
        hidden: int = 128,
        seed: int = 0,
        max_rows: int = 1024,
    ) -> None:
        super().__init__()
        owner = "ComplementaryInfoNCE"
        self.temperature = check_positive(owner, "temperature", temperature)
        self.projection_dim = check_at_least(owner, "projection_dim", projection_dim, 0)
        self.hidden = check_at_least(owner, "hidden", hidden)
        self.max_rows = check_at_least(owner, "max_rows", max_rows)
        masking = masking if masking is not None else CorrelatedFieldMask(0.5)
        self.view = View(masking, corruptions, seed=seed)
        self.projection: nn.Module = nn.Identity()

    def setup(self, backbone: BackboneProtocol) -> None:
        """Build the projection head ``H -> projection_dim`` when one is asked for."""
        if self.projection_dim:
            out = backbone.dims.output_dim
            self.projection = ProjectionHead(out, self.hidden, self.projection_dim)

    def views(self, batch: Batch, backbone: BackboneProtocol) -> tuple[torch.Tensor, torch.Tensor]:
        """``(z1, z2)``, ``float32[B, H]``: ``batch`` with the mask and with its complement."""
        batch, mask = self.view.corrupt(batch, backbone)
        z1 = self.projection(backbone(batch, mask).pooled)
        z2 = self.projection(backbone(batch, ~mask).pooled)
        return z1, z2

    def forward(self, batch: Batch, backbone: BackboneProtocol) -> ObjectiveOutput:
        """NT-Xent of the two complementary views; logs alignment and uniformity."""
        z1, z2 = self.views(batch.head(self.max_rows), backbone)
        return nt_xent_output(z1, z2, self.temperature)
