"""``FbgemmInt8Linear``: a Linear layer on FBGEMM's dynamic INT8 kernel, inside torch.

Weights are stored as symmetric per-output-row INT8 with one float32 scale per row, as plain
tensors (so a state loads with ``torch.load(weights_only=True)``), and packed once for
``torch.ops.quantized.linear_dynamic``: each call quantizes its input to UINT8 with one
scale and zero point for the whole batch, multiplies in integers (FBGEMM's x86 GEMM, AVX2 /
AVX512 / VNNI) and returns float32. The activations use 7 bits (``reduce_range``), so the
pairwise UINT8 x INT8 products fit int16 on CPUs without VNNI, as torch's x86 default does.

Because the activation scale comes from the whole batch, a row's output depends slightly on
the other rows in its batch (within the quantization error).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

__all__ = ["FbgemmInt8Linear"]

_QMAX = 127
# torch flags quantized tensor creation as deprecated; the packed weight FBGEMM's kernel
# needs is built from one, and the user can do nothing about the message.
_DEPRECATION = "torch.quantize_per_tensor, torch.quantize_per_channel"


class FbgemmInt8Linear(nn.Module):
    """INT8-weight Linear layer run by FBGEMM's dynamic quantized kernel.

    Args:
        in_features: input width ``K``.
        out_features: output width ``N``.
        bias: whether the layer adds a bias.
        relu: apply ReLU to the output inside the kernel (FBGEMM's fused output stage).

    Shape:
        ``float32[..., K] -> float32[..., N]``.

    Example:
        >>> layer = FbgemmInt8Linear.from_float(nn.Linear(4, 2))
        >>> layer(torch.zeros(3, 4)).shape
        torch.Size([3, 2])

    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, relu: bool = False
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.relu = bool(relu)
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scale", torch.ones(out_features))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)
        self._packed: Any = None

    @classmethod
    def from_float(cls, linear: nn.Linear, relu: bool = False) -> FbgemmInt8Linear:
        """Quantize a trained ``nn.Linear`` (round to nearest, symmetric per output row)."""
        weight = linear.weight.detach().float()
        scale = (weight.abs().amax(dim=1) / _QMAX).clamp_min(torch.finfo(torch.float32).tiny)
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, relu)
        layer.weight = (weight / scale[:, None]).round().clamp(-_QMAX, _QMAX).to(torch.int8)
        layer.scale = scale
        if linear.bias is not None:
            layer.bias = linear.bias.detach().float().clone()
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``float32[..., N]`` outputs (the input is cast to float32)."""
        if self._packed is None:
            self._packed = self._pack()
        if self.relu:
            return torch.ops.quantized.linear_relu_dynamic(x.float(), self._packed, True)
        return torch.ops.quantized.linear_dynamic(x.float(), self._packed, True)

    def dequantized_weight(self) -> torch.Tensor:
        """``float32[N, K]``: the weights the kernel multiplies by."""
        return self.weight.float() * self.scale[:, None]

    def _pack(self) -> Any:
        zero_points = torch.zeros(self.out_features, dtype=torch.int64)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", _DEPRECATION, UserWarning)
            weight = torch._make_per_channel_quantized_tensor(
                self.weight, self.scale.double(), zero_points, 0
            )
        return torch.ops.quantized.linear_prepack(weight, self.bias)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._packed = None  # packed from the new weights on the next call

    def __getstate__(self) -> dict[str, Any]:
        # Copies repack lazily rather than copy FBGEMM's packed object.
        return {**self.__dict__, "_packed": None}

    def extra_repr(self) -> str:
        """Widths, shown by ``print(model)``."""
        return f"in_features={self.in_features}, out_features={self.out_features}, relu={self.relu}"
