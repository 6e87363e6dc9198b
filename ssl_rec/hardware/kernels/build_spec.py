"""What the compiled kernels are built from: sources, flags and the key that names a build.

Shared by the install-time build (``setup.py``, which loads this file by its path: no torch
and nothing else of the package may be imported here, so a build without torch can still
read it) and the run-time build of :mod:`ssl_rec.hardware.kernels.dispatch`.
"""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path

CSRC_DIR = Path(__file__).parent / "csrc"
SOURCES = ("simd_variants.cpp", "checks.cpp", "admission.cpp", "gather_update.cpp", "module.cpp")
# fp-contract=off keeps the training kernels bit-identical to the reference (no FMA); no
# -march: the binary's AVX2/AVX-512 variants carry their own target attributes. GCC would
# turn the 256-byte row copies into memmove calls.
CFLAGS = ("-O3", "-fopenmp", "-ffp-contract=off", "-fno-tree-loop-distribute-patterns")
LDFLAGS = ("-fopenmp",)
INSTALLED_MODULE = "ssl_rec.hardware.kernels._embedding_ops"


def source_key(torch_version: str, csrc_dir: Path = CSRC_DIR) -> str:
    """Hash of what a binary of the kernels depends on, wherever it was built.

    Args:
        torch_version: ``torch.__version__`` of the build (the binary links its ABI).
        csrc_dir: The folder of the ``.cpp`` / ``.h`` sources.

    Returns:
        16 hex digits over the sources' names and bytes, :data:`CFLAGS`, the torch version
        and the machine architecture. The CPU's features are left out: one binary carries
        every instruction-set variant and picks one when loaded.
    """
    h = hashlib.sha1()
    for path in sorted(csrc_dir.iterdir()):
        if path.suffix in (".cpp", ".h"):
            h.update(path.name.encode() + path.read_bytes())
    for part in (*CFLAGS, torch_version, platform.machine()):
        h.update(part.encode())
    return h.hexdigest()[:16]


def key_define(key: str) -> str:
    """The compiler flag that compiles ``key`` into the module (its ``build_key()``)."""
    return f"-DSSL_REC_BUILD_KEY={key}"
