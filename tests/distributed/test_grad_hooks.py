"""Reduced-precision dense gradient all-reduce (DDP comm hooks), on a 1-process gloo group."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ssl_rec.distributed.grad_hooks import gradient_hook


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_hook_reduces_gradients_in_low_precision(precision: str, tmp_path: Path) -> None:
    store = f"file://{tmp_path / 'store'}"
    dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        layer = torch.nn.Linear(64, 1, bias=False)
        model = DistributedDataParallel(layer)
        model.register_comm_hook(None, gradient_hook(precision))
        x = torch.randn(8, 64) / 3
        model(x).sum().backward()
        exact = x.sum(0)
        dtype = torch.float16 if precision == "fp16" else torch.bfloat16
        assert torch.equal(layer.weight.grad[0], exact.to(dtype).float())
        assert not torch.equal(layer.weight.grad[0], exact)  # the precision really was reduced
    finally:
        dist.destroy_process_group()


def test_unknown_precision_is_refused() -> None:
    assert gradient_hook("fp32") is None
    with pytest.raises(ValueError, match="gradient_precision='int8'"):
        gradient_hook("int8")
