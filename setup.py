"""Build the compiled CPU kernels at install time (everything else is in pyproject.toml).

The extension ``ssl_rec.hardware.kernels._embedding_ops`` is compiled from the sources and
with the flags of ``ssl_rec/hardware/kernels/build_spec.py``, the same as the run-time build,
and carries their key (``build_key()``) so that a stale binary is recognised at run time.

torch is needed to build it but is not a build requirement (pip would put a multi-GB CUDA
torch into an isolated build environment): install torch first, then this package with
``pip install --no-build-isolation`` (the Makefile does). Without torch at build time, or
when the compiler fails, the package installs without the extension and says so; at run time
ssl-rec then says what to do.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
CSRC = "ssl_rec/hardware/kernels/csrc"


def _build_spec():
    # By path: importing the package would import torch.
    path = ROOT / "ssl_rec" / "hardware" / "kernels" / "build_spec.py"
    spec = importlib.util.spec_from_file_location("_ssl_rec_build_spec", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _say(message: str) -> None:
    print(f"ssl-rec setup: {message}", file=sys.stderr)


def _kernels() -> dict:
    """``ext_modules`` and ``cmdclass`` of the kernels, or nothing when torch is missing."""
    # torch warns when numpy is not installed yet, as in a first install: harmless here.
    warnings.filterwarnings("ignore", "Failed to initialize NumPy")
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        _say(
            "torch is not importable here, so the compiled kernels are NOT built (a build "
            "with build isolation has no torch). Install torch first, then reinstall with "
            "`pip install --no-build-isolation`; until then ssl-rec builds them at run time."
        )
        return {}
    from setuptools.errors import CompileError

    spec = _build_spec()

    class BuildKernels(BuildExtension):
        """torch's BuildExtension with the run-time build's flags, and no failed install."""

        def build_extensions(self) -> None:
            """Compile with the compiler, ``-fPIC`` and the extension's own flags only."""
            # Python's own CFLAGS (-g -DNDEBUG -fwrapv -Wall ...) would make this binary
            # differ from the run-time build: keep only the compiler and -fPIC.
            self.compiler.set_executable("compiler_so", [self.compiler.compiler_so[0], "-fPIC"])
            super().build_extensions()

        def build_extension(self, ext) -> None:
            """Build ``ext``; a failure is reported and skips it (the extension is optional)."""
            try:
                super().build_extension(ext)
            except Exception as err:  # noqa: BLE001 - ninja's failure is a RuntimeError
                _say(
                    f"building the compiled kernels failed ({type(err).__name__}); the package "
                    "is installed without them and ssl-rec tries to build them at run time. "
                    "Install a C++ compiler with OpenMP (e.g. g++) and reinstall."
                )
                raise CompileError(str(err)) from err  # skipped: the extension is optional

    key = spec.source_key(torch.__version__, ROOT / CSRC)
    ext = CppExtension(
        spec.INSTALLED_MODULE,
        sources=[f"{CSRC}/{name}" for name in spec.SOURCES],
        extra_compile_args=[*spec.CFLAGS, spec.key_define(key)],
        extra_link_args=list(spec.LDFLAGS),
        optional=True,
    )
    return {"ext_modules": [ext], "cmdclass": {"build_ext": BuildKernels}}


if __name__ == "__main__":  # as setuptools' build backend runs it; tests import _kernels
    setup(**_kernels())
