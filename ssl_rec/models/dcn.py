"""DCNv2 encoder: a cross network stacked on the concatenated embeddings, then a deep MLP.

Wang et al., "DCN V2: Improved Deep & Cross Network and Practical Lessons for Web-scale
Learning to Rank Systems", WWW 2021, https://arxiv.org/abs/2008.13535.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ssl_rec.models.mlp import MLP


class CrossLayer(nn.Module):
    """One DCNv2 cross layer ``x_{l+1} = x0 * (W x_l + b) + x_l``, optionally low-rank.

    Shape:
        ``x0, x float32[B, W] -> float32[B, W]``.
    """

    def __init__(self, width: int, low_rank: int | None = None) -> None:
        super().__init__()
        if low_rank is None:
            self.proj: nn.Module = nn.Linear(width, width)
        else:
            if low_rank <= 0:
                raise ValueError(f"CrossLayer.low_rank must be positive, got {low_rank}")
            self.proj = nn.Sequential(
                nn.Linear(width, low_rank, bias=False), nn.Linear(low_rank, width)
            )

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Apply the cross interaction."""
        return x0 * self.proj(x) + x


class DCNv2Encoder(nn.Module):
    """Stacked DCNv2: cross layers over ``[flatten(field_emb), dense]``, then an MLP.

    Args:
        n_fields: number of categorical fields ``F``.
        n_dense: number of dense features.
        embedding_dim: ``D``.
        cross_layers: number of cross layers (>= 1).
        low_rank: rank of the cross projection, or ``None`` for full rank.
        deep: widths of the MLP after the cross network; the last one is ``H``.
        dropout: dropout in the deep MLP.

    Shape:
        ``field_emb float32[B, F, D]``, ``dense float32[B, n_dense]`` ->
        ``(pooled float32[B, H], None)``.

    """

    def __init__(
        self,
        n_fields: int,
        n_dense: int,
        embedding_dim: int,
        cross_layers: int = 3,
        low_rank: int | None = 64,
        deep: Sequence[int] = (256, 128),
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if cross_layers < 1 or not deep:
            raise ValueError(
                f"DCNv2Encoder needs cross_layers >= 1 and a deep width, got {cross_layers}, {deep}"
            )
        width = n_fields * embedding_dim + n_dense
        self.cross = nn.ModuleList(CrossLayer(width, low_rank) for _ in range(cross_layers))
        self.deep = MLP(width, list(deep), dropout=dropout, activate_last=True)
        self.output_dim = self.deep.out_dim

    def forward(
        self, field_emb: torch.Tensor, dense: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Encode one batch; see the class docstring for shapes."""
        x0 = torch.cat([field_emb.flatten(1), dense], dim=1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        return self.deep(x), None
