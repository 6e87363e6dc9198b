"""Pick the compiled kernels, else the pure-torch reference; never a silent slowdown.

The C++/OpenMP extension is built with ``torch.utils.cpp_extension.load`` on first use and
cached in ``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/ssl_rec/torch_extensions``) under a
name keyed by the sources, the compiler flags, the torch version and the CPU's features,
so a home directory shared by different machines never loads a binary built for another
CPU. One binary holds portable, AVX2 and AVX-512 variants of the row kernels; the widest
the CPU runs is used.

Environment:
    ``SSL_REC_KERNELS``: ``auto`` (default) uses the compiled kernels; if they cannot be
    built, lookups fall back to the reference with one warning, and training low-precision
    or cached tables raises (the reference is ~1000x slower there). ``compiled`` makes a
    failed build an error; ``reference`` forces the reference everywhere (the documented
    override for training without a compiler).
    ``SSL_REC_SIMD``: ``portable | avx2 | avx512`` caps the compiled variant (default: the
    widest the CPU has).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import warnings
from pathlib import Path
from types import ModuleType

import torch

from ssl_rec.hardware.kernels import reference
from ssl_rec.hardware.kernels.compiled import CompiledKernels

log = logging.getLogger(__name__)
_CSRC_DIR = Path(__file__).parent / "csrc"
_SOURCES = ("simd_variants.cpp", "checks.cpp", "admission.cpp", "gather_update.cpp", "module.cpp")
# fp-contract=off keeps the training kernels bit-identical to the reference (no FMA); no
# -march: the binary's AVX2/AVX-512 variants carry their own target attributes. GCC would
# turn the 256-byte row copies into memmove calls.
_CFLAGS = ("-O3", "-fopenmp", "-ffp-contract=off", "-fno-tree-loop-distribute-patterns")
_CHOICES = ("auto", "compiled", "reference")
SIMD_LEVELS = {"portable": 0, "avx2": 1, "avx512": 2}

__all__ = [
    "SIMD_LEVELS",
    "CompiledKernels",
    "KernelsUnavailableError",
    "build_key",
    "get_kernels",
    "load_compiled",
    "require_training_kernels",
]


class KernelsUnavailableError(RuntimeError):
    """The compiled kernels cannot be built and the caller needs them."""


def _cpu_features() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    for line in text.splitlines():
        key = line.split(":", 1)[0].strip().lower()
        if key in ("flags", "features"):
            return " ".join(sorted(line.split(":", 1)[1].split()))
    return platform.processor()


def build_key() -> str:
    """Hash of what the binary depends on: sources, flags, torch, machine and CPU features."""
    h = hashlib.sha1()
    for path in sorted(_CSRC_DIR.iterdir()):
        if path.suffix in (".cpp", ".h"):
            h.update(path.name.encode() + path.read_bytes())
    for part in (*_CFLAGS, torch.__version__, platform.machine(), _cpu_features()):
        h.update(part.encode())
    return h.hexdigest()[:12]


def build_extension(source_dir: Path, name: str) -> ModuleType:
    """Build (unless built before) and import the kernels' sources in ``source_dir`` as ``name``.

    Built with this module's flags under ``$TORCH_EXTENSIONS_DIR`` (default
    ``~/.cache/ssl_rec/torch_extensions``)/``name``; ``name`` must change with the sources
    (:func:`build_key` does for the installed ones).
    """
    from torch.utils import cpp_extension

    default = Path.home() / ".cache" / "ssl_rec" / "torch_extensions"
    build_dir = Path(os.environ.get("TORCH_EXTENSIONS_DIR", default)) / name
    build_dir.mkdir(parents=True, exist_ok=True)
    if not any(build_dir.glob("*.so")):
        log.info("building the embedding kernels (once per machine and version, about a "
                 "minute) in %s", build_dir)  # fmt: skip
    return cpp_extension.load(
        name=name,
        sources=[str(source_dir / s) for s in _SOURCES],
        build_directory=str(build_dir),
        extra_cflags=list(_CFLAGS),
        extra_ldflags=["-fopenmp"],
        verbose=False,
    )


@functools.lru_cache(maxsize=1)
def load_compiled() -> ModuleType:
    """Build (once per machine) and import the C++ extension; raises if the build fails.

    Returns:
        The extension module (``admit``, ``gather``, ``update``, ``lookup``,
        ``bag_lookup``, ``row_bytes``, ``simd_level``, ...), its variant set by
        ``SSL_REC_SIMD``.

    """
    ext = build_extension(_CSRC_DIR, f"ssl_rec_embedding_ops_{build_key()}")
    simd = os.environ.get("SSL_REC_SIMD")
    if simd is not None:
        if simd not in SIMD_LEVELS:
            raise ValueError(f"SSL_REC_SIMD={simd!r} is not one of {list(SIMD_LEVELS)}")
        ext.set_simd_level(min(SIMD_LEVELS[simd], ext.max_simd_level()))
    return ext


def _mode() -> str:
    choice = os.environ.get("SSL_REC_KERNELS", "auto")
    if choice not in _CHOICES:
        raise ValueError(f"SSL_REC_KERNELS={choice!r} is not one of {list(_CHOICES)}")
    return choice


@functools.lru_cache(maxsize=1)
def _auto() -> tuple[ModuleType | CompiledKernels, str | None]:
    try:
        return CompiledKernels(load_compiled()), None
    except Exception as err:  # noqa: BLE001 - any build failure is reported, see below
        reason = f"{type(err).__name__}: {err}".strip()
        warnings.warn(
            f"ssl_rec compiled embedding kernels unavailable ({reason}); lookups use the "
            "pure-torch reference kernels, and training low-precision tables needs "
            "SSL_REC_KERNELS=reference",
            RuntimeWarning,
            stacklevel=3,
        )
        return reference, reason


@functools.lru_cache(maxsize=1)
def _compiled() -> CompiledKernels:
    return CompiledKernels(load_compiled())


def get_kernels() -> ModuleType | CompiledKernels:
    """The kernels to use, chosen by ``SSL_REC_KERNELS`` (``auto | compiled | reference``).

    Returns:
        ``reference`` (a module) or a :class:`CompiledKernels`; both expose ``admit``,
        ``gather``, ``update``, ``forward`` and ``bag_lookup`` with the same signatures.

    """
    choice = _mode()
    if choice == "reference":
        return reference
    if choice == "compiled":
        return _compiled()
    return _auto()[0]


def require_training_kernels(what: str) -> ModuleType | CompiledKernels:
    """The kernels for training ``what``, refusing the silent ~1000x slower reference.

    Raises:
        KernelsUnavailableError: In ``auto`` mode when the compiled kernels cannot be built;
            ``SSL_REC_KERNELS=reference`` accepts the reference explicitly.

    """
    kernels = get_kernels()
    if kernels is reference and _mode() == "auto":
        raise KernelsUnavailableError(
            f"training {what} needs the compiled kernels, which could not be built "
            f"({_auto()[1]}); the pure-torch reference is ~1000x slower there. Install a C++ "
            "compiler with OpenMP (e.g. g++) and ninja, or set SSL_REC_KERNELS=reference to "
            "train with the reference anyway"
        )
    return kernels
