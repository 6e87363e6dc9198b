"""Embedding kernels: the pure-torch reference (the oracle) and compiled C++/OpenMP twins."""

from ssl_rec.hardware.kernels.dispatch import get_kernels, load_compiled

__all__ = ["get_kernels", "load_compiled"]
