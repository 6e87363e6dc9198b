"""Kernel choice: no silent fallback for training, build cache keyed by the CPU."""

import pytest
import torch

from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec
from ssl_rec.hardware.kernels import dispatch, reference
from ssl_rec.hardware.kernels.dispatch import (
    CompiledKernels,
    KernelsUnavailableError,
    build_key,
    get_kernels,
    load_compiled,
)


@pytest.fixture
def no_compiler(monkeypatch):
    """The compiled kernels fail to build, as on a machine without a C++ compiler."""

    def fail():
        raise RuntimeError("no C++ compiler")

    dispatch._auto.cache_clear()
    monkeypatch.setattr(dispatch, "load_compiled", fail)
    monkeypatch.delenv("SSL_REC_KERNELS", raising=False)
    yield
    dispatch._auto.cache_clear()


def _train_step(spec):
    emb = MixedPrecisionEmbeddingCollection([30, 20], 8, spec).train()
    emb(torch.tensor([[1, 2], [3, 4]])).sum().backward()
    return emb


def test_low_precision_training_refuses_the_slow_reference(no_compiler):
    with pytest.warns(RuntimeWarning, match="unavailable"):
        with pytest.raises(KernelsUnavailableError, match="SSL_REC_KERNELS=reference"):
            _train_step(TableSpec("int8", 0.5))
    emb = MixedPrecisionEmbeddingCollection([30, 20], 8, TableSpec("int8", 0.5)).eval()
    assert emb(torch.tensor([[1, 2]])).shape == (1, 2, 8)  # lookups still work
    _train_step(TableSpec("fp32"))  # FP32 tables train on the reference at full speed


def test_reference_override_trains_without_compiler(no_compiler, monkeypatch):
    monkeypatch.setenv("SSL_REC_KERNELS", "reference")
    assert get_kernels() is reference
    emb = _train_step(TableSpec("int8", 0.5))
    assert emb.cache_stats()["misses"] == 4


def test_dispatch_env(monkeypatch):
    monkeypatch.setenv("SSL_REC_KERNELS", "reference")
    assert get_kernels() is reference
    monkeypatch.setenv("SSL_REC_KERNELS", "compiled")
    assert isinstance(get_kernels(), CompiledKernels)
    monkeypatch.setenv("SSL_REC_KERNELS", "fast")
    with pytest.raises(ValueError, match="SSL_REC_KERNELS"):
        get_kernels()


def test_build_cache_is_keyed_by_cpu_features(monkeypatch):
    key = build_key()
    assert load_compiled().build_key() == dispatch.installed_key()  # the binary's own key
    monkeypatch.setattr(dispatch, "_cpu_features", lambda: "fpu sse sse2")
    other = build_key()
    monkeypatch.setattr(dispatch, "_cpu_features", lambda: "fpu sse sse2 avx2")
    assert len({key, other, build_key()}) == 3


def test_simd_env_caps_the_variant(monkeypatch):
    ext = load_compiled()
    assert ext.simd_name() == ("portable", "avx2", "avx512")[ext.simd_level()]
    previous = ext.set_simd_level(0)
    try:
        assert ext.simd_name() == "portable"
        with pytest.raises(ValueError, match="not available"):
            ext.set_simd_level(ext.max_simd_level() + 1)
    finally:
        ext.set_simd_level(previous)
    monkeypatch.setenv("SSL_REC_SIMD", "neon")
    load_compiled.cache_clear()
    try:
        with pytest.raises(ValueError, match="SSL_REC_SIMD"):
            load_compiled()
    finally:
        monkeypatch.delenv("SSL_REC_SIMD")
        load_compiled.cache_clear()
