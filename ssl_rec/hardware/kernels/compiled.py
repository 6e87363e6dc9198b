"""The compiled kernels behind the interface of :mod:`ssl_rec.hardware.kernels.reference`."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from ssl_rec.hardware.kernels.layout import Plan, TableTensors

__all__ = ["CompiledKernels"]


def _tables(t: TableTensors) -> tuple:
    return (
        t.stores,
        t.cache_rows,
        t.cache_tags,
        t.cache_state,
        t.stats,
        t.momentum,
        t.meta,
        t.hparams,
    )


class CompiledKernels:
    """The C++ extension's kernels; every call validates its inputs in C++ first.

    Args:
        ext: The module returned by ``dispatch.load_compiled()``.

    """

    def __init__(self, ext: ModuleType) -> None:
        self._ext = ext

    @property
    def simd(self) -> str:
        """The instruction-set variant in use: ``portable``, ``avx2`` or ``avx512``."""
        return str(self._ext.simd_name())

    def forward(self, t: TableTensors, ids: torch.Tensor) -> torch.Tensor:
        """See :func:`reference.forward`."""
        return self._ext.lookup(*_tables(t), ids)

    def admit(
        self,
        t: TableTensors,
        ids: torch.Tensor,
        seed: int,
        step: int,
        locks: Sequence[Plan] = (),
        parallel: bool = True,
    ) -> Plan:
        """See :func:`reference.admit`; ``parallel=False`` keeps it on the calling thread."""
        return Plan(*self._ext.admit(*_tables(t), ids, seed, step, [tuple(p) for p in locks],
                                     parallel))  # fmt: skip

    def gather(self, t: TableTensors, plan: Plan) -> torch.Tensor:
        """See :func:`reference.gather`."""
        return self._ext.gather(*_tables(t), tuple(plan))

    def update(self, t: TableTensors, plan: Plan, grad: torch.Tensor, seed: int, step: int) -> None:
        """See :func:`reference.update`."""
        self._ext.update(*_tables(t), tuple(plan), grad, seed, step)

    def bag_lookup(
        self,
        store: torch.Tensor,
        bits: int,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        dim: int,
    ) -> torch.Tensor:
        """See :func:`reference.bag_lookup`."""
        return self._ext.bag_lookup(store, bits, indices, offsets, dim)
