"""Low-precision twins of the dense layers, one layer at a time.

A dense *layer* is an ``nn.Linear`` of the encoder or head, or a parameter-free pairwise
interaction (DLRM's :class:`~ssl_rec.models.DotInteraction`, a batched matrix product that
costs as much as a Linear layer at serving time). The precisions of a Linear layer, by
stored bytes per weight:

- ``fp32``: the trained layer, unchanged.
- ``bf16``: weights, bias and the matrix product in bfloat16 (oneDNN's AVX512-BF16 kernels
  on CPUs that have them).
- ``fp16``: weights stored in float16, the product in FP32 (CPUs have no fast FP16 GEMM).
- ``int8_weight_only``: torchao's ``Int8WeightOnlyConfig`` (symmetric per-output-row INT8
  weights) on the bfloat16 layer: 1 byte per weight, bfloat16 products.
- ``int8_dynamic``: torchao's ``Int8DynamicActivationInt8WeightConfig``: INT8 weights and
  per-row INT8 activations quantized at run time, integer products.

An interaction has no weights: ``bf16`` runs its products in bfloat16.

Every layer of a built model is wrapped in :class:`PrecisionLayer`, which casts its input
to the layer's compute dtype and hands its output on in that dtype: consecutive bfloat16
layers pass bfloat16 activations without casting back and forth, and the operations between
layers (ReLU, concatenation, products) follow PyTorch's type promotion.

torchao (``pip install --no-deps torchao==0.18.0``, the ``serve`` extra) is imported only
when an INT8 layer is built or loaded.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator

import torch
from torch import nn

from ssl_rec.models import DotInteraction

__all__ = [
    "DENSE_PRECISIONS",
    "PrecisionLayer",
    "convert_layer",
    "dense_layers",
    "import_torchao",
    "tensor_bytes",
]

DENSE_PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16", "int8_weight_only", "int8_dynamic")
# Dtype of a layer's input and output, and the dtype its weights are kept in before torchao.
_COMPUTE = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float32,
    "int8_weight_only": torch.bfloat16,
    "int8_dynamic": torch.float32,
}
_STORAGE = {**_COMPUTE, "fp16": torch.float16}
# Messages torchao and torch print on import that say nothing about the user's run
# (CUDA-only extension libraries failing to load on a CPU build, a pytree deprecation).
_IMPORT_NOISE = ("torchao", "torch.utils._pytree")


def import_torchao() -> object:
    """Import ``torchao.quantization`` (raising a clear error when torchao is missing).

    The import also registers torchao's tensor subclasses as safe globals, so quantized
    state dicts load with ``torch.load(weights_only=True)``.
    """
    levels = {name: logging.getLogger(name).level for name in _IMPORT_NOISE}
    for name in _IMPORT_NOISE:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import torchao.quantization as quantization
    except ImportError as e:
        raise ImportError(
            "INT8 dense layers need torchao: pip install --no-deps torchao==0.18.0 "
            "(or `pip install ssl-rec[serve]`)"
        ) from e
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    return quantization


class PrecisionLayer(nn.Module):
    """A dense layer run at ``precision``: input cast to its compute dtype, output left in it.

    Args:
        layer: the layer, already converted (see :func:`convert_layer`).
        precision: one of :data:`DENSE_PRECISIONS`.

    Shape:
        as the wrapped layer; the output dtype is bfloat16 for ``bf16`` and
        ``int8_weight_only``, float32 otherwise.

    """

    def __init__(self, layer: nn.Module, precision: str) -> None:
        super().__init__()
        if precision not in _COMPUTE:
            raise ValueError(
                f"PrecisionLayer.precision={precision!r} is not one of {list(_COMPUTE)}"
            )
        self.layer = layer
        self.precision = precision
        self.compute_dtype = _COMPUTE[precision]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Cast in and run the layer."""
        if self.precision == "fp16":  # FP16 storage, FP32 products
            bias = None if self.layer.bias is None else self.layer.bias.float()
            return nn.functional.linear(x.float(), self.layer.weight.float(), bias)
        return self.layer(x.to(self.compute_dtype))

    def extra_repr(self) -> str:
        """The precision, shown by ``print(model)``."""
        return f"precision={self.precision}"


def convert_layer(layer: nn.Module, precision: str) -> PrecisionLayer:
    """A copy of ``layer`` at ``precision``, wrapped in a :class:`PrecisionLayer`.

    Args:
        layer: a trained FP32 ``nn.Linear`` or interaction (left untouched).
        precision: one of :data:`DENSE_PRECISIONS` (an interaction: ``fp32`` or ``bf16``).

    Example:
        >>> layer = convert_layer(nn.Linear(4, 2), "bf16")
        >>> layer(torch.zeros(3, 4)).dtype
        torch.bfloat16

    """
    if precision not in DENSE_PRECISIONS:
        raise ValueError(f"dense precision {precision!r} is not one of {list(DENSE_PRECISIONS)}")
    if isinstance(layer, PrecisionLayer):
        layer = layer.layer
    if isinstance(layer, DotInteraction):
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"an interaction runs in fp32 or bf16, got {precision!r}")
        return PrecisionLayer(copy.deepcopy(layer), precision)
    if not isinstance(layer, nn.Linear):
        raise TypeError(
            f"convert_layer needs an nn.Linear or DotInteraction, got {type(layer).__name__}"
        )
    layer = copy.deepcopy(layer).requires_grad_(False).to(_STORAGE[precision])
    if precision.startswith("int8"):
        quantization = import_torchao()
        config = (
            quantization.Int8WeightOnlyConfig()
            if precision == "int8_weight_only"
            else quantization.Int8DynamicActivationInt8WeightConfig(set_inductor_config=False)
        )
        quantization.quantize_(layer, config)
    return PrecisionLayer(layer, precision)


def dense_layers(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    """``(qualified name, layer)`` of every Linear layer and interaction, in definition order.

    A layer wrapped in a :class:`PrecisionLayer` is yielded (and named) as the wrapper.
    """
    for name, child in module.named_children():
        if isinstance(child, PrecisionLayer | nn.Linear | DotInteraction):
            yield f"{prefix}{name}", child
        else:
            yield from dense_layers(child, f"{prefix}{name}.")


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor stores, counting each inner tensor of a torchao tensor subclass."""
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is not None:
        names, _ = flatten()
        return sum(tensor_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()
