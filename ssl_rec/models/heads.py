"""Prediction heads on top of a backbone's pooled representation."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ssl_rec.models.mlp import MLP


class CTRHead(nn.Module):
    """Click logit from the pooled representation: optional hidden layers, then one unit.

    Args:
        in_dim: pooled width ``H``.
        hidden: widths of hidden layers before the output unit (empty = linear head).
        dropout: dropout after each hidden layer.

    Shape:
        ``float32[B, H] -> float32[B]`` (logits).

    """

    def __init__(self, in_dim: int, hidden: Sequence[int] = (), dropout: float = 0.0) -> None:
        super().__init__()
        self.mlp = MLP(in_dim, [*hidden, 1], dropout=dropout)

    @property
    def output(self) -> nn.Linear:
        """The one-unit output layer."""
        return self.mlp[-1]

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        """Return one logit per row."""
        return self.mlp(pooled).squeeze(-1)
