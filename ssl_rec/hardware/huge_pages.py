"""Large table buffers on transparent huge pages.

A training step touches rows of every table at random: with 4 KiB pages nearly every row
access misses the TLB (a 250 000-row INT8 store spans 4 400 pages, a CPU's second-level TLB
holds a few thousand), and each miss walks the page tables before the row's own DRAM access
can start. On 2 MiB pages the same store spans 9 pages. Linux backs an anonymous mapping with
huge pages when asked (``madvise(MADV_HUGEPAGE)``) before its pages are first written, in its
default ``madvise`` mode and in ``always`` mode; elsewhere the request does nothing.

PyTorch asks for every allocation of at least 2 MiB when ``THP_MEM_ALLOC_ENABLE=1`` is set
before it starts; this module asks for the tables' own buffers only, whatever the
environment. ``SSL_REC_HUGE_PAGES=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

import torch

__all__ = ["HUGE_PAGE_BYTES", "empty", "huge_pages_enabled", "zeros"]

HUGE_PAGE_BYTES = 2 << 20
_MADV_HUGEPAGE = 14  # linux/mman.h


def huge_pages_enabled() -> bool:
    """Whether new table buffers ask for huge pages (Linux, unless ``SSL_REC_HUGE_PAGES=0``)."""
    return sys.platform == "linux" and os.environ.get("SSL_REC_HUGE_PAGES", "1") != "0"


@functools.cache
def _madvise():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _advise(t: torch.Tensor) -> None:
    """Ask for huge pages over the whole 2 MiB pages inside ``t``'s bytes (best effort)."""
    start = t.data_ptr()
    first = -(-start // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    end = (start + t.numel() * t.element_size()) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    if end > first:
        # A refusal (no THP support, a kernel without MADV_HUGEPAGE) leaves 4 KiB pages.
        _madvise()(first, end - first, _MADV_HUGEPAGE)


def empty(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype)``, on huge pages where the OS grants them.

    The pages are requested before anything writes them, so buffers of at least 2 MiB get
    huge pages at their first write; smaller ones, or any buffer when
    :func:`huge_pages_enabled` is false, are plain ``torch.empty`` tensors.
    """
    t = torch.empty(shape, dtype=dtype)
    if huge_pages_enabled() and t.numel() * t.element_size() >= HUGE_PAGE_BYTES:
        _advise(t)
    return t


def zeros(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``torch.zeros(shape, dtype=dtype)`` on huge pages where granted (see :func:`empty`)."""
    return empty(shape, dtype).zero_()
