"""Pick the compiled kernels, else the pure-torch reference with one warning.

The C++/OpenMP extension is built with ``torch.utils.cpp_extension.load`` on first use and
cached in ``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/ssl_rec/torch_extensions``).
``SSL_REC_KERNELS=reference`` forces the reference; ``SSL_REC_KERNELS=compiled`` makes a
failed build an error instead of a fallback.
"""

from __future__ import annotations

import functools
import hashlib
import os
import warnings
from pathlib import Path
from types import ModuleType

import torch

from ssl_rec.hardware.kernels import reference
from ssl_rec.hardware.kernels.layout import TableTensors

_CSRC_DIR = Path(__file__).parent / "csrc"
_CSRC = _CSRC_DIR / "embedding_ops.cpp"  # includes row_format.cpp
_CHOICES = ("auto", "compiled", "reference")

_NO_SLOTS = torch.empty(0, dtype=torch.int32)

__all__ = ["CompiledKernels", "get_kernels", "load_compiled"]


@functools.lru_cache(maxsize=1)
def load_compiled() -> ModuleType:
    """Build (once per machine) and import the C++ extension; raises if the build fails.

    Returns:
        The extension module with ``forward``, ``train_forward``, ``update``,
        ``bag_lookup`` and ``row_bytes``.

    """
    from torch.utils import cpp_extension

    default = Path.home() / ".cache" / "ssl_rec" / "torch_extensions"
    build_root = Path(os.environ.get("TORCH_EXTENSIONS_DIR", default))
    # torch only rebuilds when a listed source changes; the included file counts through
    # the content hash in the name.
    digest = hashlib.sha1(b"".join(p.read_bytes() for p in sorted(_CSRC_DIR.glob("*.cpp"))))
    name = f"ssl_rec_embedding_ops_{digest.hexdigest()[:10]}"
    build_dir = build_root / name
    build_dir.mkdir(parents=True, exist_ok=True)
    return cpp_extension.load(
        name=name,
        sources=[str(_CSRC)],
        build_directory=str(build_dir),
        # fp-contract=off keeps the training kernels bit-identical to the reference.
        extra_cflags=["-O3", "-march=native", "-fopenmp", "-ffp-contract=off"],
        extra_ldflags=["-fopenmp"],
        verbose=False,
    )


class CompiledKernels:
    """The compiled kernels behind the same Python interface as ``reference``."""

    def __init__(self, ext: ModuleType) -> None:
        self._ext = ext

    def forward(self, t: TableTensors, ids: torch.Tensor) -> torch.Tensor:
        """See :func:`reference.forward`."""
        return self._ext.forward(t.stores, t.cache_rows, t.cache_tags, t.meta, ids)

    def train_forward(
        self, t: TableTensors, ids: torch.Tensor, seed: int, step: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :func:`reference.train_forward`."""
        out, slots = self._ext.train_forward(
            t.stores, t.cache_rows, t.cache_tags, t.cache_state, t.stats, t.meta, ids, seed, step
        )
        return out, slots

    def update(
        self,
        t: TableTensors,
        ids: torch.Tensor,
        grad: torch.Tensor,
        seed: int,
        step: int,
        slots: torch.Tensor | None = None,
    ) -> None:
        """See :func:`reference.update`."""
        self._ext.update(
            t.stores,
            t.cache_rows,
            t.cache_tags,
            t.stats,
            t.momentum,
            t.meta,
            t.hparams,
            ids,
            grad.contiguous(),
            _NO_SLOTS if slots is None else slots,
            seed,
            step,
        )

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


@functools.lru_cache(maxsize=1)
def _auto() -> ModuleType | CompiledKernels:
    try:
        return CompiledKernels(load_compiled())
    except Exception as err:  # noqa: BLE001 - any build failure falls back, loudly once
        warnings.warn(
            f"ssl_rec compiled embedding kernels unavailable ({type(err).__name__}: {err}); "
            "using the slow pure-torch reference kernels",
            RuntimeWarning,
            stacklevel=3,
        )
        return reference


def get_kernels() -> ModuleType | CompiledKernels:
    """The kernels to use, chosen by ``SSL_REC_KERNELS`` (``auto | compiled | reference``).

    Returns:
        ``reference`` (a module) or a :class:`CompiledKernels`; both expose ``forward``,
        ``train_forward``, ``update`` and ``bag_lookup`` with the same signatures.

    """
    choice = os.environ.get("SSL_REC_KERNELS", "auto")
    if choice not in _CHOICES:
        raise ValueError(f"SSL_REC_KERNELS={choice!r} is not one of {list(_CHOICES)}")
    if choice == "reference":
        return reference
    if choice == "compiled":
        return CompiledKernels(load_compiled())
    return _auto()
