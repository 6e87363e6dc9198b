"""Pick the compiled kernels, else the pure-torch reference; never a silent slowdown.

The C++/OpenMP extension is compiled when the package is installed (``setup.py``: ``make``
or ``pip install --no-build-isolation``) into ``ssl_rec/hardware/kernels/_embedding_ops*.so``
and only imported here: no compiler runs at command time. The binary carries the key of its
sources, flags and torch version (``build_key()``); one that does not match the installed
sources (an editable install whose sources changed since, or another torch) is not used.
One binary holds portable, AVX2 and AVX-512 variants of the row kernels; the widest the CPU
runs is used.

When no matching binary is installed, the extension is built at run time with
``torch.utils.cpp_extension.load`` (one line on stderr says why and where) into
``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/ssl_rec/torch_extensions``) under a name keyed by
the sources, flags, torch version, the CPU's features, the interpreter (``sys.prefix``) and
the package's folder, so two installs (two clones, two venvs) never rebuild each other's.

Environment:
    ``SSL_REC_KERNELS``: ``auto`` (default) uses the compiled kernels; if they are neither
    installed nor buildable, lookups fall back to the reference with one warning, and
    training low-precision or cached tables raises (the reference is ~1000x slower there).
    ``compiled`` makes kernels neither installed nor buildable an error; ``jit`` (for
    kernel development) always builds the working sources at run time, and a failed build
    is an error; ``reference`` forces the reference everywhere (the documented override for
    training without a compiler).
    ``SSL_REC_SIMD``: ``portable | avx2 | avx512`` caps the compiled variant (default: the
    widest the CPU has).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import logging
import os
import platform
import sys
import warnings
from pathlib import Path
from types import ModuleType

import torch

from ssl_rec.hardware.kernels import build_spec, reference
from ssl_rec.hardware.kernels.compiled import CompiledKernels

log = logging.getLogger(__name__)
_PACKAGE_DIR = Path(__file__).resolve().parent
_CSRC_DIR = build_spec.CSRC_DIR
_SOURCES = build_spec.SOURCES
_CFLAGS = build_spec.CFLAGS
_CHOICES = ("auto", "compiled", "jit", "reference")
SIMD_LEVELS = {"portable": 0, "avx2": 1, "avx512": 2}
_REINSTALL = "reinstall with `make setup`, or `pip install --no-build-isolation` after torch"

__all__ = [
    "SIMD_LEVELS",
    "CompiledKernels",
    "KernelsUnavailableError",
    "build_extension",
    "build_key",
    "get_kernels",
    "installed_key",
    "load_compiled",
    "require_training_kernels",
    "stale_reason",
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


def installed_key() -> str:
    """The key a usable installed binary carries: these sources, flags and torch version."""
    return build_spec.source_key(torch.__version__, _CSRC_DIR)


def build_key(prefix: str = sys.prefix, package_dir: Path = _PACKAGE_DIR) -> str:
    """Name key of the run-time build: :func:`installed_key`, CPU features and install.

    Args:
        prefix: The interpreter's ``sys.prefix`` (a venv's folder).
        package_dir: The folder of this package (a clone's or site-packages').

    Returns:
        12 hex digits; torch writes one install's absolute include paths into a build's
        ``build.ninja``, so two installs sharing a build folder would rebuild it in turn.
    """
    h = hashlib.sha1()
    for part in (installed_key(), platform.machine(), _cpu_features(), prefix, str(package_dir)):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:12]


def stale_reason(found: str | None, expected: str) -> str | None:
    """Why an installed binary whose ``build_key()`` is ``found`` must not be used.

    Args:
        found: The binary's key (None: it has no ``build_key()``, an older build).
        expected: :func:`installed_key`.

    Returns:
        None when the keys match, else a short reason for the one-line message.
    """
    if found == expected:
        return None
    built = f"key {found}" if found else "no key"
    return (
        f"the installed compiled kernels are stale ({built}; these sources and this torch "
        f"are key {expected})"
    )


def build_extension(source_dir: Path, name: str, reason: str | None = None) -> ModuleType:
    """Build (unless built before) and import the kernels' sources in ``source_dir`` as ``name``.

    Built with the install-time build's flags under ``$TORCH_EXTENSIONS_DIR`` (default
    ``~/.cache/ssl_rec/torch_extensions``)/``name``; ``name`` must change with the sources
    (:func:`build_key` does for the installed ones). Prints one line on stderr when it builds,
    or, given ``reason`` (why the installed binary is not used), one line in any case.
    """
    from torch.utils import cpp_extension

    default = Path.home() / ".cache" / "ssl_rec" / "torch_extensions"
    build_dir = Path(os.environ.get("TORCH_EXTENSIONS_DIR", default)) / name
    build_dir.mkdir(parents=True, exist_ok=True)
    why = f"{reason}; " if reason else ""
    if not any(build_dir.glob("*.so")):
        log.warning(
            "ssl-rec: %sbuilding the compiled kernels (one time, about a minute) into %s",
            why,
            build_dir,
        )
    elif reason:
        log.warning("ssl-rec: %susing the run-time build in %s", why, build_dir)
    key = build_spec.source_key(torch.__version__, source_dir)
    return cpp_extension.load(
        name=name,
        sources=[str(source_dir / s) for s in _SOURCES],
        build_directory=str(build_dir),
        extra_cflags=[*_CFLAGS, build_spec.key_define(key)],
        extra_ldflags=list(build_spec.LDFLAGS),
        verbose=False,
    )


def _installed() -> tuple[ModuleType | None, str]:
    """The installed binary if it matches the sources, else None and why not."""
    if importlib.util.find_spec(build_spec.INSTALLED_MODULE) is None:
        return None, f"no compiled kernels were installed with ssl_rec ({_REINSTALL})"
    try:
        ext = importlib.import_module(build_spec.INSTALLED_MODULE)
    except ImportError as err:  # e.g. built against another torch: undefined symbols
        return None, f"the installed compiled kernels do not load ({err}; {_REINSTALL})"
    found = ext.build_key() if hasattr(ext, "build_key") else None
    reason = stale_reason(found, installed_key())
    if reason is not None:
        return None, f"{reason}; {_REINSTALL}"
    return ext, ""


def _run_time_build(reason: str | None) -> ModuleType:
    return build_extension(_CSRC_DIR, f"ssl_rec_embedding_ops_{build_key()}", reason)


@functools.lru_cache(maxsize=1)
def load_compiled() -> ModuleType:
    """Import the installed C++ extension, else build it at run time; raises if that fails.

    Returns:
        The extension module (``admit``, ``gather``, ``update``, ``lookup``,
        ``bag_lookup``, ``row_bytes``, ``simd_level``, ``build_key``, ...), its variant set
        by ``SSL_REC_SIMD``: the installed one when it matches the sources, the run-time
        build with ``SSL_REC_KERNELS=jit``.

    """
    if _mode() == "jit":
        ext = _run_time_build(None)
    else:
        ext, reason = _installed()
        if ext is None:
            ext = _run_time_build(reason)
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
    """The kernels to use, chosen by ``SSL_REC_KERNELS`` (``auto | compiled | jit | reference``).

    Returns:
        ``reference`` (a module) or a :class:`CompiledKernels`; both expose ``admit``,
        ``gather``, ``update``, ``forward`` and ``bag_lookup`` with the same signatures.

    """
    choice = _mode()
    if choice == "reference":
        return reference
    if choice in ("compiled", "jit"):
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
