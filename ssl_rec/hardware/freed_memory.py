"""Keep freed memory in the process instead of handing it back to the OS after every step.

glibc serves an allocation above its mmap threshold (128 KiB at start, raised to the size of
the last such block freed, at most 32 MiB) from a fresh mapping and unmaps it when it is
freed. A training step allocates its large tensors anew each time (the embedding output of a
4096-sample batch of 26 tables at D = 64 is 27 MiB, its gradient as much): each then costs a
page fault per 4 KiB page on first write, which on a shared host can take longer than the
step's own work. With the thresholds raised, freed blocks stay in the heap and the next step
reuses their pages (what jemalloc or tcmalloc, preloaded, do for PyTorch on CPU).

The ``ssl-rec`` command calls :func:`keep_freed_memory` at start-up; ``SSL_REC_KEEP_FREED_MEMORY=0``
leaves the allocator as it is. Elsewhere than on glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

__all__ = ["MALLOC_ENV", "keep_freed_memory"]

# (mallopt parameter of malloc.h, value, the environment variable that sets it at start-up)
_SETTINGS = (
    (-3, 1 << 30, "MALLOC_MMAP_THRESHOLD_"),  # M_MMAP_THRESHOLD: blocks below 1 GiB from the heap
    (-1, 1 << 31, "MALLOC_TRIM_THRESHOLD_"),  # M_TRIM_THRESHOLD: trimmed above 2 GiB free only
    (-2, 1 << 28, "MALLOC_TOP_PAD_"),  # M_TOP_PAD: the heap grown 256 MiB at a time
)
# The same settings as environment variables, for a process started with them (benchmarks).
MALLOC_ENV = {name: str(value) for _, value, name in _SETTINGS}


@functools.cache
def _mallopt():
    try:
        fn = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows)
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed blocks for reuse; returns whether every setting was accepted.

    Process-wide and idempotent. False, changing nothing, on other C libraries, off Linux or
    when ``SSL_REC_KEEP_FREED_MEMORY=0``.
    """
    if sys.platform != "linux" or os.environ.get("SSL_REC_KEEP_FREED_MEMORY", "1") == "0":
        return False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    return all(mallopt(param, value) == 1 for param, value, _ in _SETTINGS)
