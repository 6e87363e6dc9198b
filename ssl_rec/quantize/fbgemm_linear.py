"""``FbgemmInt8Linear``: a Linear layer on FBGEMM's dynamic INT8 kernel, inside torch.

Weights are stored as symmetric per-output-row INT8 with one float32 scale per row, as plain
tensors (so a state loads with ``torch.load(weights_only=True)``), and packed once for
``torch.ops.quantized.linear_dynamic``: each call quantizes its input to UINT8 with one
scale and zero point for the whole batch, multiplies in integers (FBGEMM's x86 GEMM, AVX2 /
AVX512 / VNNI) and returns float32. The activations use 7 bits (``reduce_range``), so the
pairwise UINT8 x INT8 products fit int16 on CPUs without VNNI, as torch's x86 default does.

Because the activation scale comes from the whole batch, a row's output depends slightly on
the other rows in its batch (within the quantization error).

A large call (at least :data:`LARGE_ROWS` rows, at least :data:`WIDE_OUTPUT` outputs) on a CPU
with AMX runs the same product on oneDNN's kernel (``torch.backends.quantized`` engine
``onednn``, the weights packed for it too): the same 7-bit activation quantization and INT8
weights, so the outputs equal FBGEMM's up to the float rounding of the dequantization
(~1e-7 relative), at about half its time (AMX INT8 tiles against AVX-512 VNNI).

A call of at most :data:`SMALL_PRODUCT` multiply-adds (rows x ``K`` x ``N``: a few rows, as
when serving one request) multiplies in FP32 by the dequantized weights instead
(:meth:`FbgemmInt8Linear.dequantized_weight`, kept once computed; the input is not
quantized): FBGEMM's fixed cost per call, quantizing and packing the input, is larger than
that product. Such a call's output is the INT8 weights' exact FP32 product, so it differs
from what a larger batch gives the same row by the activations' quantization error. A call
of one row (batch-1 serving) runs that product on the compiled kernels' ``int8_linear``
where they are built: it reads the INT8 weights themselves (a quarter of the bytes of the
dequantized ones) and widens them in registers, 1.7-2.7x faster than the FP32 product at
one row on an AVX-512 CPU (the same values up to float32 rounding of the sums).
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Any

import torch
from torch import nn

from ssl_rec.hardware import serving_kernels

__all__ = ["LARGE_ROWS", "SMALL_PRODUCT", "WIDE_OUTPUT", "FbgemmInt8Linear"]

_QMAX = 127
# Multiply-adds per call up to which the FP32 product beats FBGEMM's dynamic kernel, whose
# input quantization costs ~15 us a call (one thread, AVX-512 Xeon: 415 x 512 at 4 rows 41 us
# FP32 vs 44 us INT8, at 8 rows 60 vs 50; 512 x 256 at 8 rows 24 vs 28).
SMALL_PRODUCT = 1 << 20
# Calls from which oneDNN's AMX kernel beats FBGEMM's (one thread, time FBGEMM / oneDNN:
# 415 x 512 at 1024 rows 1.99x, 4096 rows 2.32x; 512 x 256 1.63x / 1.87x; 13 x 512 1.92x /
# 1.98x; 64 outputs 0.96x at 1024 rows, 1.13x at 4096: FBGEMM kept for narrow layers).
LARGE_ROWS = 1024
WIDE_OUTPUT = 128
# torch flags quantized tensor creation as deprecated; the packed weight FBGEMM's kernel
# needs is built from one, and the user can do nothing about the message.
_DEPRECATION = "torch.quantize_per_tensor, torch.quantize_per_channel"
_ENGINE_SWITCH = threading.Lock()


@functools.cache
def _one_row_kernel() -> Any:
    """The compiled kernels' ``int8_linear`` (a one-row call's product), or ``None``.

    Looked up once per process: a lookup costs a serving call about 1 µs.
    """
    kernels = serving_kernels()
    return None if kernels is None else kernels.int8_linear


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
        self._packed_amx: Any = None  # oneDNN's packing, for large calls
        self._float_weight: torch.Tensor | None = None  # dequantized, for small calls

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
        x = x.float()
        if x.numel() == self.in_features and not x.requires_grad:  # one row: a serving call
            one_row = _one_row_kernel()
            if one_row is not None:
                row = x if x.dim() == 2 and x.is_contiguous() else x.reshape(1, -1).contiguous()
                out = one_row(row, self.weight, self.scale, self.bias, self.relu)
                return out if x.dim() == 2 else out.reshape(*x.shape[:-1], self.out_features)
        if x.numel() * self.out_features <= SMALL_PRODUCT:  # rows x K x N multiply-adds
            if self._float_weight is None:
                self._float_weight = self.dequantized_weight()
            out = nn.functional.linear(x, self._float_weight, self.bias)
            return out.relu_() if self.relu else out
        packed = self._large_call_packing(x)
        if packed is None:
            packed = self._fbgemm_packing()
        if self.relu:
            return torch.ops.quantized.linear_relu_dynamic(x, packed, True)
        return torch.ops.quantized.linear_dynamic(x, packed, True)

    def _fbgemm_packing(self) -> Any:
        if self._packed is None:
            self._packed = self._pack("fbgemm")
        return self._packed

    def _large_call_packing(self, x: torch.Tensor) -> Any:
        rows = x.numel() // self.in_features
        if rows < LARGE_ROWS or self.out_features < WIDE_OUTPUT or not _amx_int8():
            return None
        if getattr(self, "_packed_amx", None) is None:
            self._packed_amx = self._pack("onednn")
        return self._packed_amx

    def dequantized_weight(self) -> torch.Tensor:
        """``float32[N, K]``: the weights the kernel multiplies by."""
        return self.weight.float() * self.scale[:, None]

    def _pack(self, engine: str = "fbgemm") -> Any:
        zero_points = torch.zeros(self.out_features, dtype=torch.int64)
        with _ENGINE_SWITCH:  # the engine is process-wide: one switch at a time
            previous = torch.backends.quantized.engine
            try:
                return self._prepack(engine, zero_points)
            finally:
                torch.backends.quantized.engine = previous

    def _prepack(self, engine: str, zero_points: torch.Tensor) -> Any:
        # The packing (and so the kernel a call runs) is the engine's set at prepack.
        torch.backends.quantized.engine = engine
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", _DEPRECATION, UserWarning)
            weight = torch._make_per_channel_quantized_tensor(
                self.weight, self.scale.double(), zero_points, 0
            )
        return torch.ops.quantized.linear_prepack(weight, self.bias)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        # made from the new weights when next needed
        self._packed = self._packed_amx = self._float_weight = None

    def __getstate__(self) -> dict[str, Any]:
        # Copies repack lazily rather than copy the kernels' packed objects.
        return {**self.__dict__, "_packed": None, "_packed_amx": None, "_float_weight": None}

    def extra_repr(self) -> str:
        """Widths, shown by ``print(model)``."""
        return f"in_features={self.in_features}, out_features={self.out_features}, relu={self.relu}"


@functools.cache
def _amx_int8() -> bool:
    """Whether oneDNN's quantized engine is built in and the CPU has AMX tiles."""
    if "onednn" not in torch.backends.quantized.supported_engines:
        return False
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe and probe())
