"""Low-precision twins of the dense layers, one layer at a time.

A dense *layer* is an ``nn.Linear`` of the encoder or head, or a parameter-free pairwise
interaction (DLRM's :class:`~ssl_rec.models.DotInteraction`, a batched matrix product that
costs as much as a Linear layer at serving time). The precisions of a Linear layer, by
stored bytes per weight:

- ``fp32``: the trained layer, unchanged.
- ``bf16``: weights, bias and the matrix product in bfloat16 (oneDNN's AVX512-BF16 kernels
  on CPUs that have them).
- ``fp16``: weights stored in float16, the product in FP32 (CPUs have no fast FP16 GEMM).
- ``int8_fbgemm``: FBGEMM's dynamic INT8 kernel in torch
  (:class:`~ssl_rec.quantize.fbgemm_linear.FbgemmInt8Linear`): INT8 weights per output
  row, activations quantized per batch at run time, integer products; the fast INT8 choice
  on x86 CPUs.
- ``int8_weight_only``: torchao's ``Int8WeightOnlyConfig`` (symmetric per-output-row INT8
  weights) on the bfloat16 layer: 1 byte per weight, bfloat16 products.
- ``int8_dynamic``: torchao's ``Int8DynamicActivationInt8WeightConfig``: INT8 weights and
  per-row INT8 activations quantized at run time, integer products.

An interaction has no weights: ``fp32`` runs the library's compiled kernel
(:class:`CompiledInteraction`: the upper triangle only, each dot product summed in order;
several times faster than ``torch.bmm`` then a gather at DLRM's shapes), ``bf16`` runs
``torch.bmm`` in bfloat16 (oneDNN's AVX512-BF16 kernel, then a bfloat16 gather).

Every layer of a built model is wrapped in :class:`PrecisionLayer`, which casts its input
to the layer's compute dtype and hands its output on in that dtype: consecutive bfloat16
layers pass bfloat16 activations without casting back and forth, and the operations between
layers (concatenation, products) follow PyTorch's type promotion. A ReLU that follows a
Linear layer in a ``Sequential`` moves into the layer (:func:`fuse_relus`), so FBGEMM's
kernel applies it in its output stage instead of one more pass over the activations.

torchao (``pip install --no-deps torchao==0.18.0``, the ``serve`` extra) is imported only
when one of its INT8 layers is built or loaded.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Iterator

import torch
from torch import nn

from ssl_rec.hardware import serving_kernels
from ssl_rec.models import DotInteraction
from ssl_rec.quantize.fbgemm_linear import FbgemmInt8Linear

__all__ = [
    "CompiledInteraction",
    "DENSE_PRECISIONS",
    "TORCHAO_PRECISIONS",
    "PrecisionLayer",
    "convert_layer",
    "dense_layers",
    "fuse_relus",
    "relu_followed",
    "import_torchao",
    "tensor_bytes",
]

DENSE_PRECISIONS: tuple[str, ...] = (
    "fp32",
    "bf16",
    "fp16",
    "int8_fbgemm",
    "int8_weight_only",
    "int8_dynamic",
)
# The precisions torchao implements.
TORCHAO_PRECISIONS = frozenset({"int8_weight_only", "int8_dynamic"})
# Dtype of a layer's input and output, and the dtype its weights are kept in before torchao.
_COMPUTE = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float32,
    "int8_fbgemm": torch.float32,
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
        relu: apply ReLU to the output (the layer's own, when it fuses it).

    Shape:
        as the wrapped layer; the output dtype is bfloat16 for ``bf16`` and
        ``int8_weight_only``, float32 otherwise.

    """

    def __init__(self, layer: nn.Module, precision: str, relu: bool = False) -> None:
        super().__init__()
        if precision not in _COMPUTE:
            raise ValueError(
                f"PrecisionLayer.precision={precision!r} is not one of {list(_COMPUTE)}"
            )
        self.layer = layer
        self.precision = precision
        self.compute_dtype = _COMPUTE[precision]
        self.relu = relu and not getattr(layer, "relu", False)  # not when the layer fuses it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Cast in and run the layer."""
        if self.precision == "fp16":  # FP16 storage, FP32 products
            bias = None if self.layer.bias is None else self.layer.bias.float()
            out = nn.functional.linear(x.float(), self.layer.weight.float(), bias)
        else:
            out = self.layer(x.to(self.compute_dtype))
        return torch.relu(out) if self.relu else out

    def extra_repr(self) -> str:
        """The precision, shown by ``print(model)``."""
        return f"precision={self.precision}, relu={self.relu}"


class CompiledInteraction(DotInteraction):
    """:class:`~ssl_rec.models.DotInteraction` served by the compiled FP32 kernel.

    Falls back to the module's own ``torch.bmm`` path without the compiled kernels, for
    inputs that need a gradient, and for other dtypes. No state: a saved model's
    interaction loads into either class.

    Shape:
        ``float32[B, N, D] -> float32[B, N * (N - 1) / 2]``.
    """

    @classmethod
    def of(cls, layer: DotInteraction) -> CompiledInteraction:
        """The compiled twin of ``layer`` (same number of vectors)."""
        num_vectors = (1 + math.isqrt(1 + 8 * layer.out_dim)) // 2
        return cls(num_vectors)

    def forward(self, vectors: torch.Tensor) -> torch.Tensor:
        """The pairwise dot products, by the compiled kernel where it applies."""
        kernels = serving_kernels()
        if kernels is None or vectors.dtype != torch.float32 or vectors.requires_grad:
            return super().forward(vectors)
        return kernels.interaction(vectors.contiguous())


def convert_layer(layer: nn.Module, precision: str, relu: bool = False) -> PrecisionLayer:
    """A copy of ``layer`` at ``precision``, wrapped in a :class:`PrecisionLayer`.

    Args:
        layer: a trained FP32 ``nn.Linear`` or interaction (left untouched).
        precision: one of :data:`DENSE_PRECISIONS` (an interaction: ``fp32`` or ``bf16``).
        relu: the layer also applies the ReLU that follows it (see :func:`fuse_relus`).

    Example:
        >>> layer = convert_layer(nn.Linear(4, 2), "bf16")
        >>> layer(torch.zeros(3, 4)).dtype
        torch.bfloat16

    """
    if precision not in DENSE_PRECISIONS:
        raise ValueError(f"dense precision {precision!r} is not one of {list(DENSE_PRECISIONS)}")
    if isinstance(layer, PrecisionLayer):
        layer = layer.layer
    if isinstance(layer, FbgemmInt8Linear):
        raise TypeError("convert_layer needs the FP32 layer, got an INT8 one")
    if isinstance(layer, DotInteraction):
        if precision not in ("fp32", "bf16") or relu:
            raise ValueError(f"an interaction runs in fp32 or bf16 alone, got {precision!r}")
        twin = CompiledInteraction.of(layer) if precision == "fp32" else copy.deepcopy(layer)
        return PrecisionLayer(twin, precision)
    if not isinstance(layer, nn.Linear):
        raise TypeError(
            f"convert_layer needs an nn.Linear or DotInteraction, got {type(layer).__name__}"
        )
    if precision == "int8_fbgemm":
        return PrecisionLayer(FbgemmInt8Linear.from_float(layer, relu), precision, relu)
    layer = copy.deepcopy(layer).requires_grad_(False).to(_STORAGE[precision])
    if precision in TORCHAO_PRECISIONS:
        quantization = import_torchao()
        config = (
            quantization.Int8WeightOnlyConfig()
            if precision == "int8_weight_only"
            else quantization.Int8DynamicActivationInt8WeightConfig(set_inductor_config=False)
        )
        quantization.quantize_(layer, config)
    return PrecisionLayer(layer, precision, relu)


def dense_layers(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Module]]:
    """``(qualified name, layer)`` of every Linear layer and interaction, in definition order.

    A layer wrapped in a :class:`PrecisionLayer` is yielded (and named) as the wrapper.
    """
    for name, child in module.named_children():
        if isinstance(child, PrecisionLayer | nn.Linear | DotInteraction):
            yield f"{prefix}{name}", child
        else:
            yield from dense_layers(child, f"{prefix}{name}.")


def relu_followed(module: nn.Module, prefix: str = "") -> set[str]:
    """Qualified names of the Linear layers directly followed by an ``nn.ReLU`` in a Sequential."""
    names: set[str] = set()
    children = list(module.named_children())
    for i, (name, child) in enumerate(children):
        after = children[i + 1][1] if i + 1 < len(children) else None
        in_sequence = isinstance(module, nn.Sequential) and isinstance(after, nn.ReLU)
        if in_sequence and isinstance(child, nn.Linear | PrecisionLayer):
            names.add(f"{prefix}{name}")
        names |= relu_followed(child, f"{prefix}{name}.")
    return names


def fuse_relus(module: nn.Module, names: set[str]) -> None:
    """Replace the ReLU after each layer in ``names`` by ``nn.Identity`` (in place).

    The layers themselves must apply it (``convert_layer(..., relu=True)``).
    """
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name)
        keys = list(parent._modules)
        after = keys[keys.index(child) + 1]
        if isinstance(parent._modules[after], nn.ReLU):
            parent._modules[after] = nn.Identity()


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor stores, counting each inner tensor of a torchao tensor subclass."""
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is not None:
        names, _ = flatten()
        return sum(tensor_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()
