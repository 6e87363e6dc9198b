"""DLRM encoder: bottom MLP for dense features, pairwise dot interaction, top MLP.

Naumov et al., "Deep Learning Recommendation Model for Personalization and Recommendation
Systems", 2019, https://arxiv.org/abs/1906.00091.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ssl_rec.models.mlp import MLP


class _UpperDotProducts(torch.autograd.Function):
    """The upper triangle of ``V V^T`` with a one-product backward.

    Autograd of ``gather(bmm(V, V^T))`` scatters the gradient into ``[B, N, N]`` and runs two
    batched products (one per operand of ``bmm``); the gradient of a Gram matrix is
    ``(G + G^T) V``, one product. ``G`` is zero outside the upper triangle, so ``G + G^T`` is
    ``G`` read into both triangles: one gather from the gradient padded with a zero column
    (the same values as the sum, without zero-filling and adding ``[B, N, N]`` tensors).
    The forward is the module's own (same values).
    """

    @staticmethod
    def forward(  # noqa: D102
        ctx,  # noqa: ANN001
        vectors: torch.Tensor,
        upper: torch.Tensor,
        symmetric: torch.Tensor,
    ) -> torch.Tensor:
        ctx.save_for_backward(vectors, symmetric)
        gram = torch.bmm(vectors, vectors.transpose(1, 2)).flatten(1)
        return torch.gather(gram, 1, upper.expand(gram.shape[0], -1))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # noqa: ANN001, D102
        vectors, symmetric = ctx.saved_tensors
        n = vectors.shape[1]
        padded = F.pad(grad.to(vectors.dtype), (0, 1))
        full = padded.index_select(1, symmetric).view(-1, n, n)
        return torch.bmm(full, vectors), None, None


class DotInteraction(nn.Module):
    """Pairwise dot products between ``N`` vectors, upper triangle without the diagonal.

    Shape:
        ``float32[B, N, D] -> float32[B, N * (N - 1) / 2]``.
    """

    def __init__(self, num_vectors: int) -> None:
        super().__init__()
        rows, cols = torch.triu_indices(num_vectors, num_vectors, offset=1)
        # One gather from the flattened matrix: several times faster on CPU than indexing
        # two dimensions with (rows, cols), for float32 and bfloat16 alike.
        self.register_buffer("_upper", rows * num_vectors + cols, persistent=False)
        self.out_dim = int(rows.numel())
        # For backward: entry (i, j) of the symmetric gradient is pair k's where (i, j) or
        # (j, i) is pair k, else the zero column appended at index out_dim.
        symmetric = torch.full((num_vectors * num_vectors,), self.out_dim, dtype=torch.long)
        pairs = torch.arange(self.out_dim)
        symmetric[rows * num_vectors + cols] = pairs
        symmetric[cols * num_vectors + rows] = pairs
        self.register_buffer("_symmetric", symmetric, persistent=False)

    def forward(self, vectors: torch.Tensor) -> torch.Tensor:
        """Return the flattened upper triangle of ``vectors @ vectors^T``."""
        if torch.is_grad_enabled() and vectors.requires_grad:
            return _UpperDotProducts.apply(vectors, self._upper, self._symmetric)
        gram = torch.bmm(vectors, vectors.transpose(1, 2)).flatten(1)
        return torch.gather(gram, 1, self._upper.expand(gram.shape[0], -1))


class DLRMEncoder(nn.Module):
    """Dense features and field embeddings to one pooled vector, DLRM style.

    Args:
        n_fields: number of categorical fields ``F``.
        n_dense: number of dense features; 0 disables the bottom MLP.
        embedding_dim: ``D``; the bottom MLP ends at ``D`` so it joins the interaction.
        bottom: hidden widths of the bottom MLP before its ``D``-wide output layer.
        top: widths of the top MLP; the last one is the pooled size ``H``.
        dropout: dropout in the top MLP.

    Shape:
        ``field_emb float32[B, F, D]``, ``dense float32[B, n_dense]`` ->
        ``(pooled float32[B, H], dense_emb float32[B, D] | None)``.

    """

    def __init__(
        self,
        n_fields: int,
        n_dense: int,
        embedding_dim: int,
        bottom: Sequence[int] = (64,),
        top: Sequence[int] = (256, 128),
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if not top:
            raise ValueError("DLRMEncoder.top needs at least one width (the pooled size H)")
        self.bottom = (
            MLP(n_dense, [*bottom, embedding_dim], activate_last=True) if n_dense else None
        )
        n_vectors = n_fields + (1 if n_dense else 0)
        self.interaction = DotInteraction(n_vectors)
        top_in = self.interaction.out_dim + (embedding_dim if n_dense else 0)
        self.top = MLP(top_in, list(top), dropout=dropout, activate_last=True)
        self.output_dim = self.top.out_dim

    def forward(
        self, field_emb: torch.Tensor, dense: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Encode one batch; see the class docstring for shapes."""
        if self.bottom is None:
            dense_emb = None
            vectors = field_emb
            parts = [self.interaction(vectors)]
        else:
            dense_emb = self.bottom(dense)
            vectors = torch.cat([dense_emb.unsqueeze(1), field_emb], dim=1)
            parts = [dense_emb, self.interaction(vectors)]
        return self.top(torch.cat(parts, dim=1)), dense_emb
