"""A plain multi-layer perceptron used by encoders and heads."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class ReLUDropout(nn.ReLU):
    """ReLU then dropout with probability ``p`` (in training mode only): one Sequential slot.

    A subclass of ``nn.ReLU`` so that serving conversions that fuse a Linear layer with the
    ReLU after it still do: in eval mode this module is a plain ReLU.

    Shape:
        ``float32[*] -> float32[*]``.
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``dropout(relu(x))``; the kept entries are scaled by ``1 / (1 - p)`` in training."""
        return F.dropout(F.relu(x), self.p, self.training)

    def extra_repr(self) -> str:
        """``p=...`` in the module's repr."""
        return f"p={self.p}"


class MLP(nn.Sequential):
    """Linear layers with ReLU between them.

    The Linear layers sit at indices ``0, 2, 4, ...`` whatever the dropout (each activation,
    with its dropout, is one slot), so state dicts move between models that differ only in
    dropout. State dicts of the former layout, which gave dropout a slot of its own (Linear
    layers at ``0, 3, 6, ...`` when ``dropout > 0``), are renamed on load.

    Args:
        in_dim: input width.
        hidden: output width of each layer; the last entry is the output width.
        dropout: dropout probability after each hidden activation, in ``[0, 1)``; ``0``
            builds the plain ``nn.ReLU`` layers.
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
                layers.append(ReLUDropout(dropout) if dropout > 0 else nn.ReLU())
        super().__init__(*layers)
        self.out_dim = widths[-1]
        self._register_load_state_dict_pre_hook(_rename_dropout_layout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the layers: ``float32[B, in_dim] -> float32[B, out_dim]``."""
        return super().forward(x)


def _rename_dropout_layout(state: dict[str, Any], prefix: str, *args: Any) -> None:
    """Rename an MLP state of the layout with a Dropout slot: Linear ``3i`` becomes ``2i``."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.(.+)")
    found = {k: m for k in state if (m := pattern.fullmatch(k))}
    # the current layout has Linear layers at even indices only; 3, 9, ... mean the former
    if not any(int(m.group(1)) % 2 for m in found.values()):
        return
    for key, m in found.items():
        index = int(m.group(1))
        if index % 3 == 0:
            state[f"{prefix}{index // 3 * 2}.{m.group(2)}"] = state.pop(key)
