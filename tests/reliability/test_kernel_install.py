"""Compiled kernels are built once, at install; no compiler runs when a command runs.

Two clones with their own venvs used to rebuild one shared run-time build in turn (torch
writes one install's include paths into its build.ninja). Here: the installed binary is what
the library loads, a fit runs with every compiler on PATH replaced by one that records its
call and fails, a stale binary is refused with one line, and run-time builds of two installs
never share a folder.
"""

from __future__ import annotations

import logging
import os
import runpy
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.utils import cpp_extension

from ssl_rec.hardware.kernels import build_spec, dispatch

ROOT = Path(__file__).resolve().parents[2]
COMPILERS = ("c++", "g++", "gcc", "cc", "clang", "clang++", "ninja", "ld")


def _installed_binary() -> Path:
    found = sorted(Path(dispatch.__file__).parent.glob("_embedding_ops*.so"))
    assert found, "no installed kernels: run `make setup` (pip install --no-build-isolation)"
    return found[0]


def _no_compiler_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose compilers only record that they were called, and fail."""
    fake_bin, calls = tmp_path / "fake_bin", tmp_path / "compiler_calls.txt"
    fake_bin.mkdir()
    for name in COMPILERS:
        tool = fake_bin / name
        tool.write_text(f'#!/bin/sh\necho "{name} $*" >> "{calls}"\nexit 1\n')
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSL_REC_KERNELS")}
    env.pop("SSL_REC_SIMD", None)
    env.update(
        PATH=f"{fake_bin}{os.pathsep}{env['PATH']}",
        CXX=str(fake_bin / "c++"),
        CC=str(fake_bin / "cc"),
        TORCH_EXTENSIONS_DIR=str(tmp_path / "torch_extensions"),
        HOME=str(tmp_path / "home"),
    )
    (tmp_path / "torch_extensions").mkdir()
    return env, calls


@pytest.fixture
def fresh_load(monkeypatch):
    """``load_compiled`` without its once-per-process cache, in the default mode."""
    monkeypatch.delenv("SSL_REC_KERNELS", raising=False)
    monkeypatch.delenv("SSL_REC_SIMD", raising=False)
    return dispatch.load_compiled.__wrapped__


@pytest.fixture
def fake_build(tmp_path, monkeypatch):
    """Run-time builds into ``tmp_path/ext`` that only write an empty .so and record it."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    built = SimpleNamespace(paths=[], cflags=[])

    def fake_load(name: str, build_directory: str, **kwargs) -> SimpleNamespace:
        so = Path(build_directory) / f"{name}.so"
        so.write_bytes(b"")
        built.paths.append(so)
        built.cflags.append(kwargs["extra_cflags"])
        return SimpleNamespace(__name__=name)

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    return built


def test_the_installed_binary_is_what_load_compiled_returns(fresh_load):
    ext = fresh_load()
    assert ext.__name__ == build_spec.INSTALLED_MODULE
    assert Path(ext.__file__) == _installed_binary()
    assert ext.build_key() == dispatch.installed_key()
    assert ext.max_simd_level() >= 0  # one binary, its variant picked at load


SNIPPET = """
import torch
from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec
from ssl_rec.hardware.kernels.dispatch import load_compiled
emb = MixedPrecisionEmbeddingCollection([30, 20], 8, TableSpec("int8", 0.5)).train()
emb(torch.tensor([[1, 2], [3, 4]])).sum().backward()  # needs the compiled kernels
print(load_compiled().__name__)
"""


def test_commands_run_no_compiler_and_rebuild_nothing(tmp_path):
    """Two installs alternating, without a second venv: a fit, then a training step in
    another working directory with the default build folder under HOME (what a second
    clone's command used to rebuild): no compiler starts, no folder fills, no file changes."""
    binary = _installed_binary()
    before = binary.stat().st_mtime_ns
    env, calls = _no_compiler_env(tmp_path)
    script = Path(sys.executable).with_name("ssl-rec")
    entry = [sys.executable, "-c", "from ssl_rec.cli import main; main()"]
    fit = subprocess.run(
        [*([str(script)] if script.is_file() else entry), "fit",
         "--config", str(ROOT / "configs/ctr/synthetic_int8_cache.yaml"),
         "--data.init_args.n_train=300", f"--data.init_args.cache_dir={tmp_path / 'cache'}",
         "--trainer.fast_dev_run=1", "--trainer.logger=false",
         "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path / 'run'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert fit.returncode == 0, fit.stderr[-3000:]
    (tmp_path / "other").mkdir()
    default_env = {k: v for k, v in env.items() if k != "TORCH_EXTENSIONS_DIR"}
    step = subprocess.run(
        [sys.executable, "-c", SNIPPET], cwd=tmp_path / "other", env=default_env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert step.returncode == 0, step.stderr[-3000:]
    assert step.stdout.split() == [build_spec.INSTALLED_MODULE]
    for out in (fit, step):
        assert "building" not in out.stderr and "stale" not in out.stderr, out.stderr[-3000:]
    assert not calls.exists(), calls.read_text()  # no compiler was even started
    assert list((tmp_path / "torch_extensions").iterdir()) == []
    assert not (tmp_path / "home" / ".cache" / "ssl_rec" / "torch_extensions").exists()
    assert binary.stat().st_mtime_ns == before


def test_a_stale_binary_falls_back_with_one_line(fresh_load, fake_build, monkeypatch, caplog):
    monkeypatch.setattr(dispatch, "installed_key", lambda: "0123456789abcdef")
    with caplog.at_level(logging.INFO, logger="ssl_rec"):
        first = fresh_load()
        lines = [r.getMessage() for r in caplog.records]
        caplog.clear()
        fresh_load()  # built before: no build, but still not silent
        again = [r.getMessage() for r in caplog.records]
    assert first.__name__.startswith("ssl_rec_embedding_ops_") and len(fake_build.paths) == 2
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith("ssl-rec: the installed compiled kernels are stale")
    assert "0123456789abcdef" in lines[0] and "building the compiled kernels" in lines[0]
    assert str(fake_build.paths[0].parent) in lines[0] and "make setup" in lines[0]
    assert len(again) == 1 and "stale" in again[0] and "using the run-time build" in again[0]


def test_stale_reason_compares_keys():
    key = dispatch.installed_key()
    assert dispatch.stale_reason(key, key) is None
    assert "stale" in dispatch.stale_reason("ffffffffffffffff", key)
    assert "no key" in dispatch.stale_reason(None, key)  # a binary from before the key


def test_nothing_installed_builds_at_run_time_with_one_line(
    fresh_load, fake_build, monkeypatch, caplog
):
    monkeypatch.setattr(build_spec, "INSTALLED_MODULE", "ssl_rec.hardware.kernels._absent")
    with caplog.at_level(logging.INFO, logger="ssl_rec"):
        fresh_load()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "no compiled kernels were installed" in lines[0], lines
    assert "--no-build-isolation" in lines[0] and "building the compiled kernels" in lines[0]
    # same flags and key as the install-time build
    assert fake_build.cflags == [
        [*dispatch._CFLAGS, build_spec.key_define(dispatch.installed_key())]
    ]


def test_run_time_builds_of_two_installs_never_share_a_folder(tmp_path):
    one = dispatch.build_key(prefix="/clone1/.venv", package_dir=tmp_path / "clone1")
    assert one == dispatch.build_key(prefix="/clone1/.venv", package_dir=tmp_path / "clone1")
    other_venv = dispatch.build_key(prefix="/clone2/.venv", package_dir=tmp_path / "clone1")
    other_clone = dispatch.build_key(prefix="/clone1/.venv", package_dir=tmp_path / "clone2")
    assert len({one, other_venv, other_clone}) == 3
    assert dispatch.build_key() not in {one, other_venv, other_clone}


def _setup_module() -> dict:
    return runpy.run_path(str(ROOT / "setup.py"), run_name="setup_under_test")


def test_the_install_builds_what_the_run_time_build_builds():
    kernels = _setup_module()["_kernels"]()
    (ext,) = kernels["ext_modules"]
    assert ext.name == build_spec.INSTALLED_MODULE and ext.optional
    assert [Path(s).name for s in ext.sources] == list(build_spec.SOURCES)
    key = build_spec.key_define(dispatch.installed_key())
    assert ext.extra_compile_args == [*dispatch._CFLAGS, key]
    assert not any(flag.startswith("-march") for flag in ext.extra_compile_args)


def test_the_package_builds_without_torch(monkeypatch, capsys):
    kernels = _setup_module()["_kernels"]
    monkeypatch.setitem(sys.modules, "torch", None)  # as in an isolated build environment
    assert kernels() == {}
    assert "--no-build-isolation" in capsys.readouterr().err
    build_system = (ROOT / "pyproject.toml").read_text().split("[build-system]")[1].split("\n[")[0]
    assert "requires" in build_system and "torch" not in build_system, build_system
