"""``Precision``: the one description of every storage format of an embedding table.

Integer formats are FBGEMM's fused row-wise asymmetric rows (the layout of
``torch.ops.quantized.embedding_bag_byte_prepack`` / ``embedding_bag_4bit_prepack``): each
uint8 row holds the packed values (low bits first), then the row's scale and bias, FP32
for 8-bit and FP16 for 4/2-bit. Float formats are plain ``[R, D]`` tensors of their dtype.
The compiled kernels number the formats by :attr:`Precision.code` (``enum Kind`` in
``kernels/csrc/common.h``; a test checks that both sides agree).
"""

from __future__ import annotations

from enum import Enum

import torch

__all__ = ["Precision"]

_CODES = {"fp32": 0, "fp16": 1, "bf16": 2, "int8": 3, "int4": 4, "int2": 5}
_FLOAT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_BITS = {"int8": 8, "int4": 4, "int2": 2}


class Precision(str, Enum):
    """Storage format of a table; the value is the name used in YAML (``precision: int8``).

    Example:
        >>> Precision("int4").row_bytes(64), Precision.int8.qparam_bytes
        (36, 8)

    """

    fp32 = "fp32"
    fp16 = "fp16"
    bf16 = "bf16"
    int8 = "int8"
    int4 = "int4"
    int2 = "int2"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def from_code(cls, code: int) -> Precision:
        """The format numbered ``code`` in the kernels' metadata."""
        return next(p for p in cls if p.code == code)

    @property
    def code(self) -> int:
        """Number of the format in the compiled kernels' metadata."""
        return _CODES[self.value]

    @property
    def is_float(self) -> bool:
        """Whether rows are plain floats (no scale and bias)."""
        return self.value in _FLOAT_DTYPES

    @property
    def dtype(self) -> torch.dtype:
        """Element type of the store: the float dtype, or ``torch.uint8`` for fused rows."""
        return _FLOAT_DTYPES.get(self.value, torch.uint8)

    @property
    def bits(self) -> int:
        """Bits per stored value (32 or 16 for floats)."""
        return _BITS.get(self.value, self.dtype.itemsize * 8)

    @property
    def levels(self) -> int:
        """Quantization levels of an integer format, ``2**bits - 1`` (0 for floats)."""
        return 0 if self.is_float else (1 << self.bits) - 1

    @property
    def qparam_bytes(self) -> int:
        """Bytes of a row's scale and bias: 8 (two FP32) for int8, 4 (two FP16) for 4/2-bit."""
        if self.is_float:
            return 0
        return 8 if self.bits == 8 else 4

    def data_bytes(self, dim: int) -> int:
        """Bytes of a row's packed values (``D`` values, ``8 // bits`` per byte for ints)."""
        if self.is_float:
            return dim * self.dtype.itemsize
        per = 8 // self.bits
        return (dim + per - 1) // per

    def row_bytes(self, dim: int) -> int:
        """Bytes of one stored row, scale and bias included (``D + 8`` int8, ``D/2 + 4`` int4)."""
        return self.data_bytes(dim) + self.qparam_bytes

    def store_shape(self, rows: int, dim: int) -> tuple[int, int]:
        """Shape of a store of ``rows`` rows: ``[R, D]`` floats or ``[R, row_bytes]`` uint8."""
        return (rows, dim) if self.is_float else (rows, self.row_bytes(dim))

    def check_dim(self, dim: int) -> None:
        """Raise ``ValueError`` unless ``dim`` packs into whole bytes for this format."""
        per = 1 if self.is_float else 8 // self.bits
        if dim % per:
            raise ValueError(f"embedding dim {dim} must be a multiple of {per} for {self.value}")
