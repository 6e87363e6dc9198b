"""DeepFM encoder: a factorization-machine interaction beside a deep MLP.

Guo et al., "DeepFM: A Factorization-Machine based Neural Network for CTR Prediction",
IJCAI 2017, https://arxiv.org/abs/1703.04247.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ssl_rec.models.mlp import MLP


class FMInteraction(nn.Module):
    """Second-order FM term per dimension: ``0.5 * ((sum_f v_f)^2 - sum_f v_f^2)``.

    Summed over its ``D`` dimensions it is ``sum_{f<g} <v_f, v_g>``, the FM pairwise term.

    Shape:
        ``vectors float32[B, N, D] -> float32[B, D]``.
    """

    def forward(self, vectors: torch.Tensor) -> torch.Tensor:
        """Return the per-dimension pairwise interaction."""
        return 0.5 * (vectors.sum(1).square() - vectors.square().sum(1))


class DeepFMEncoder(nn.Module):
    """DeepFM over the field embeddings: FM pairwise term, first-order term and deep MLP.

    The dense features enter as one extra FM vector (a linear map to ``D``) and as inputs
    of the first-order term and the MLP. The click head's linear layer on the pooled
    vector sums the FM dimensions, weighs the first-order score and reads the MLP.

    Args:
        n_fields: number of categorical fields ``F``.
        n_dense: number of dense features (0: none).
        embedding_dim: ``D``.
        deep: widths of the deep MLP; the last one is ``H_deep``.
        dropout: dropout in the deep MLP.

    Shape:
        ``field_emb float32[B, F, D]``, ``dense float32[B, n_dense]`` ->
        ``(pooled float32[B, D + 1 + H_deep], None)``.

    """

    def __init__(
        self,
        n_fields: int,
        n_dense: int,
        embedding_dim: int,
        deep: Sequence[int] = (256, 128),
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if not deep:
            raise ValueError("DeepFMEncoder.deep needs at least one width (the MLP's output)")
        width = n_fields * embedding_dim + n_dense
        self.dense_vector = nn.Linear(n_dense, embedding_dim) if n_dense else None
        self.fm = FMInteraction()
        self.first_order = nn.Linear(width, 1)
        self.deep = MLP(width, list(deep), dropout=dropout, activate_last=True)
        self.output_dim = embedding_dim + 1 + self.deep.out_dim

    def forward(
        self, field_emb: torch.Tensor, dense: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Encode one batch; see the class docstring for shapes."""
        vectors = field_emb
        if self.dense_vector is not None:
            vectors = torch.cat([field_emb, self.dense_vector(dense).unsqueeze(1)], dim=1)
        flat = torch.cat([field_emb.flatten(1), dense], dim=1)
        return torch.cat([self.fm(vectors), self.first_order(flat), self.deep(flat)], dim=1), None
