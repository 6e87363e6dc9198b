"""The compiled kernels behind the interface of :mod:`ssl_rec.hardware.kernels.reference`."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from ssl_rec.hardware.kernels.table_meta import AdmittedBatch, TableTensors

__all__ = ["CompiledKernels"]


def _lists(t: TableTensors) -> tuple:
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


class _BoundTables(TableTensors):
    """TableTensors carrying the extension's handle of them (see ``CompiledKernels.bind``)."""

    handle: object


class CompiledKernels:
    """The C++ extension's kernels; every call validates its inputs in C++ first.

    Args:
        ext: The module returned by ``dispatch.load_compiled()``.

    """

    def __init__(self, ext: ModuleType) -> None:
        self._ext = ext

    def bind(self, t: TableTensors) -> TableTensors:
        """``t`` with a validated handle: calls given it skip converting and checking the lists.

        The handle holds ``t``'s tensors as they are now: a tensor changed in place (moved,
        reshaped) is validated again on the next call; one put in place of another (in the
        lists or in their owner) needs a new ``bind``. ``_replace`` drops the handle.
        """
        bound = _BoundTables._make(t)
        bound.handle = self._ext.TableSet(*_lists(t))
        return bound

    def _tables(self, t: TableTensors):  # noqa: ANN202 - the extension's TableSet
        h = getattr(t, "handle", None)
        return h if isinstance(h, self._ext.TableSet) else self._ext.TableSet(*_lists(t))

    @property
    def simd(self) -> str:
        """The instruction-set variant in use: ``portable``, ``avx2`` or ``avx512``."""
        return str(self._ext.simd_name())

    def forward(self, t: TableTensors, ids: torch.Tensor) -> torch.Tensor:
        """See :func:`reference.forward`."""
        return self._ext.lookup(self._tables(t), ids)

    def admit(
        self,
        t: TableTensors,
        ids: torch.Tensor,
        seed: int,
        step: int,
        locks: Sequence[AdmittedBatch] = (),
        parallel: bool = True,
    ) -> AdmittedBatch:
        """See :func:`reference.admit`; ``parallel=False`` keeps it on the calling thread."""
        locks = [tuple(p) for p in locks]
        return AdmittedBatch(*self._ext.admit(self._tables(t), ids, seed, step, locks, parallel))

    def gather(self, t: TableTensors, plan: AdmittedBatch) -> torch.Tensor:
        """See :func:`reference.gather`."""
        return self._ext.gather(self._tables(t), tuple(plan))

    def update(
        self, t: TableTensors, plan: AdmittedBatch, grad: torch.Tensor, seed: int, step: int
    ) -> None:
        """See :func:`reference.update`."""
        self._ext.update(self._tables(t), tuple(plan), grad, seed, step)

    def serve_lookup(self, t: TableTensors, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids int64[B, T]`` of uncached tables: ``float32[B, T, D]`` (inference).

        INT8 rows are dequantized with FBGEMM's rounding (``fma(scale, q, bias)`` on AVX2 /
        AVX-512), so the result equals ``torch.ops.quantized``'s row-wise ops bit for bit.
        """
        return self._ext.serve_lookup(self._tables(t), ids)

    def interaction(self, vectors: torch.Tensor) -> torch.Tensor:
        """DLRM's pairwise dot products: ``float32[B, N, D] -> float32[B, N * (N - 1) / 2]``.

        The upper triangle of ``V V^T`` without the diagonal, row-major (``triu_indices``
        order); each dot product summed over ``d`` in order (FP32, no autograd).
        """
        return self._ext.interaction(vectors)

    def int8_linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None = None,
        relu: bool = False,
    ) -> torch.Tensor:
        """``float32[R, K]`` rows times row-wise INT8 weights ``int8[N, K]`` -> ``float32[R, N]``.

        ``scale[n] * sum_k weight[n, k] * x[r, k] + bias[n]`` (``max(0, .)`` with ``relu``),
        the input used as it is (not quantized); each weight byte read once per row. Meant
        for one row (a serving call): it does not block the product like a GEMM.
        """
        return self._ext.int8_linear(x, weight, scale, bias, relu)

    def serve_interaction(
        self,
        t: TableTensors,
        ids: torch.Tensor,
        first: torch.Tensor,
        out: torch.Tensor,
        column: int,
    ) -> None:
        """DLRM's lookup and interaction in one pass, written into ``out``.

        For each sample ``b``: the :meth:`interaction` of the ``1 + T`` vectors
        ``first[b]``, ``serve_lookup(t, ids)[b]`` goes to ``out[b, column : column + P]``
        (``P = (1 + T) T / 2``); the other columns are left as they are. The vectors are
        gathered a chunk of samples at a time, never as a whole ``[B, 1 + T, D]`` tensor.

        Args:
            t: uncached tables of one ``D``.
            ids: int64[B, T].
            first: contiguous float32[B, D] (DLRM: the bottom MLP's output).
            out: contiguous float32[B, C], sharing no memory with ``first`` or ``ids``.
            column: where the pairs start, ``column + P <= C``.

        """
        self._ext.serve_interaction(self._tables(t), ids, first, out, column)

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
