"""A plain multi-layer perceptron used by encoders and heads."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class MLP(nn.Sequential):
    """Linear layers with ReLU between them.

    Args:
        in_dim: input width.
        hidden: output width of each layer; the last entry is the output width.
        dropout: dropout probability after each hidden activation, in ``[0, 1)``.
        activate_last: apply ReLU (and dropout) after the last layer too.

    Shape:
        ``float32[B, in_dim] -> float32[B, hidden[-1]]`` (identity when ``hidden`` is empty).

    Example:
        >>> MLP(4, [8, 2])(torch.zeros(3, 4)).shape
        torch.Size([3, 2])

    """

    def __init__(
        self,
        in_dim: int,
        hidden: Sequence[int],
        dropout: float = 0.0,
        activate_last: bool = False,
    ) -> None:
        if in_dim <= 0 or any(h <= 0 for h in hidden):
            raise ValueError(f"MLP widths must be positive, got in_dim={in_dim}, hidden={hidden}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"MLP dropout must be in [0, 1), got {dropout}")
        layers: list[nn.Module] = []
        widths = [in_dim, *hidden]
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
            layers.append(nn.Linear(a, b))
            if i < len(hidden) - 1 or activate_last:
                layers.append(nn.ReLU())
                if dropout > 0:
                    layers.append(nn.Dropout(dropout))
        super().__init__(*layers)
        self.out_dim = widths[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the layers: ``float32[B, in_dim] -> float32[B, out_dim]``."""
        return super().forward(x)
