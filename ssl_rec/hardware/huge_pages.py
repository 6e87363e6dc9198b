"""Large table buffers on transparent huge pages.

A training step touches rows of every table at random: with 4 KiB pages nearly every row
access misses the TLB (a 250 000-row INT8 store spans 4 400 pages, a CPU's second-level TLB
holds a few thousand), and each miss walks the page tables before the row's own DRAM access
can start. On 2 MiB pages the same store spans 9 pages. Linux backs an anonymous mapping with
huge pages when asked (``madvise(MADV_HUGEPAGE)``) before its pages are first written, in its
default ``madvise`` mode and in ``always`` mode; elsewhere the request does nothing.

The request only holds for pages not yet in memory: a buffer carved from memory the allocator
got back from an earlier tensor (glibc keeps freed heap memory) would stay on 4 KiB pages. So
each buffer of at least 2 MiB gets a fresh anonymous mapping of its own, asked for huge pages
before its first write, and is wrapped as a tensor (``torch.frombuffer``; the tensor keeps the
mapping alive). PyTorch asks for every allocation of at least 2 MiB when
``THP_MEM_ALLOC_ENABLE=1`` is set before it starts; this module asks for the tables' own
buffers only, whatever the environment. ``SSL_REC_HUGE_PAGES=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import mmap
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


def _mapped(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
    """A zero-filled tensor on a fresh mapping of its own, starting on a huge page.

    The mapping is asked for huge pages before any write. None when huge pages are off or the
    tensor is under one huge page.
    """
    numel = math.prod(shape)
    nbytes = numel * dtype.itemsize
    if not huge_pages_enabled() or nbytes < HUGE_PAGE_BYTES:
        return None
    whole_pages = -(-nbytes // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    # private: a shared anonymous mapping is shared memory, which THP leaves alone
    region = mmap.mmap(-1, whole_pages + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE)
    base = torch.frombuffer(region, dtype=torch.uint8, count=1).data_ptr()
    offset = -base % HUGE_PAGE_BYTES
    # A refusal (no THP support, a kernel without MADV_HUGEPAGE) leaves 4 KiB pages.
    _madvise()(base + offset, whole_pages, _MADV_HUGEPAGE)
    return torch.frombuffer(region, dtype=dtype, count=numel, offset=offset).view(shape)


def empty(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype)``, on huge pages where the OS grants them.

    Buffers of at least 2 MiB get a fresh mapping asked for huge pages before anything writes
    it (so their pages are huge from the first write); smaller ones, or any buffer when
    :func:`huge_pages_enabled` is false, are plain ``torch.empty`` tensors.
    """
    t = _mapped(shape, dtype)
    return torch.empty(shape, dtype=dtype) if t is None else t


def zeros(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``torch.zeros(shape, dtype=dtype)`` on huge pages where granted (see :func:`empty`)."""
    t = _mapped(shape, dtype)  # a fresh mapping reads as zeros: no fill, no page touched
    return torch.zeros(shape, dtype=dtype) if t is None else t
