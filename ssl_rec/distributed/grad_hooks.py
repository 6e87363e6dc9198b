"""Reduced-precision all-reduce of dense gradients: DDP communication hooks.

``fp16`` is PyTorch's ``fp16_compress_hook``. PyTorch's ``bf16_compress_hook`` runs on
NCCL only (DDP refuses it by name on gloo), so ``bf16`` is a cast, an all-reduce and a cast
back, which gloo runs too.
(No ``from __future__ import annotations`` here: DDP checks the hook's annotations as objects.)
"""

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

GRADIENT_PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16")

__all__ = ["GRADIENT_PRECISIONS", "bfloat16_allreduce_hook", "gradient_hook"]


def bfloat16_allreduce_hook(
    process_group: dist.ProcessGroup | None, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """All-reduce a gradient bucket in bfloat16 and average it (any backend).

    Args:
        process_group: Group to reduce over (``None``: the world).
        bucket: DDP's flattened gradient bucket.

    Returns:
        A future of the averaged float32 bucket.

    """
    group = process_group if process_group is not None else dist.group.WORLD
    compressed = bucket.buffer().to(torch.bfloat16).div_(dist.get_world_size(group))
    future = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(fut: torch.futures.Future) -> torch.Tensor:
        buffer = bucket.buffer()
        buffer.copy_(fut.value()[0])
        return buffer

    return future.then(decompress)


def gradient_hook(precision: str) -> Callable | None:
    """The DDP comm hook for ``precision`` (``None`` for ``fp32``: DDP's own all-reduce).

    Raises:
        ValueError: for a precision outside :data:`GRADIENT_PRECISIONS`.

    """
    if precision not in GRADIENT_PRECISIONS:
        raise ValueError(
            f"gradient_precision={precision!r} is not one of {list(GRADIENT_PRECISIONS)}"
        )
    hooks = {"fp32": None, "fp16": default_hooks.fp16_compress_hook,
             "bf16": bfloat16_allreduce_hook}  # fmt: skip
    return hooks[precision]
