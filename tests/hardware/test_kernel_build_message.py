"""Building the compiled kernels says so (the first build takes about a minute)."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

from torch.utils import cpp_extension

from ssl_rec.hardware.kernels import dispatch


def test_first_build_is_announced_and_a_built_one_is_not(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("SSL_REC_KERNELS", "jit")  # the run-time build, not the installed one
    monkeypatch.delenv("SSL_REC_SIMD", raising=False)
    built: list[Path] = []

    def fake_load(name: str, build_directory: str, **kwargs) -> SimpleNamespace:
        so = Path(build_directory) / f"{name}.so"
        so.write_bytes(b"")
        built.append(so)
        return SimpleNamespace()

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    load = dispatch.load_compiled.__wrapped__  # bypass the once-per-process cache
    with caplog.at_level(logging.INFO, logger="ssl_rec"):
        load()
        first = [r.getMessage() for r in caplog.records]
        caplog.clear()
        load()
        second = [r.getMessage() for r in caplog.records]
    assert len(built) == 2 and built[0].parent.parent == tmp_path
    assert any("building the compiled kernels" in m and str(tmp_path) in m for m in first)
    assert not any("building" in m for m in second)
