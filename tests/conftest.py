"""Shared pytest setup: offline W&B/HF, per-session caches, the slow marker, the
``threads`` / ``simd`` fixtures that rerun a kernel test per thread count and SIMD variant,
and ``write_clicks``, a small click-log CSV of the kind users bring."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

_SESSION_DIR = tempfile.mkdtemp(prefix="ssl_rec_tests_")
for _key, _value in {
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "WANDB_DIR": _SESSION_DIR,
    "WANDB_CACHE_DIR": _SESSION_DIR,
    "WANDB_CONFIG_DIR": _SESSION_DIR,
    "WANDB_DATA_DIR": _SESSION_DIR,
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "SSL_REC_CACHE": os.path.join(_SESSION_DIR, "cache"),
}.items():
    os.environ[_key] = _value
# Small ops on 2 shared cores run far slower with 2 threads than with 1.
torch.set_num_threads(1)


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request: pytest.FixtureRequest):
    """Run the test with 1 and with 2 intra-op threads (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.fixture(params=["portable", "avx2", "avx512"])
def simd(request: pytest.FixtureRequest):
    """Run the test with each instruction-set variant of the compiled kernels the CPU has.

    Builds the kernels (a build failure fails the test: these tests are about them).
    """
    from ssl_rec.hardware.kernels.dispatch import SIMD_LEVELS, load_compiled

    ext = load_compiled()
    level = SIMD_LEVELS[request.param]
    if level > ext.max_simd_level():
        pytest.skip(f"this CPU has no {request.param}")
    previous = ext.set_simd_level(level)
    yield request.param
    ext.set_simd_level(previous)


def _write_clicks(path: Path, n: int = 3000, users: int = 40, seed: int = 0) -> None:
    """``clicked,price,user,item`` rows: even users click more, and less at higher prices;
    items follow the user's group."""
    rng = np.random.default_rng(seed)
    user = rng.integers(0, users, n)
    item = (user // 4 * 7 + rng.integers(0, 3, n)) % 50
    price = rng.gamma(2.0, 3.0, n).round(2)
    p = 1 / (1 + np.exp(-(np.where(user % 2 == 0, 1.5, -1.5) - 0.05 * price)))
    clicked = (rng.random(n) < p).astype(int)
    rows = ["clicked,price,user,item"] + [
        f"{c},{pr},u{u},i{it}" for c, pr, u, it in zip(clicked, price, user, item, strict=True)
    ]
    path.write_text("\n".join(rows) + "\n")


@pytest.fixture(scope="session")
def write_clicks() -> Callable[..., None]:
    """``write_clicks(path, n=3000, users=40, seed=0)`` writes a click-log CSV."""
    return _write_clicks


@pytest.fixture
def cli_refuses(capsys: pytest.CaptureFixture[str]) -> Callable[..., str]:
    """``cli_refuses(argv, *parts)`` runs ``ssl-rec argv`` and returns its one error line.

    It asserts exit status 2, exactly one ``ssl-rec: error:`` line on stderr holding every
    one of ``parts``, and no traceback.
    """

    def refuses(argv: list[str], *parts: str) -> str:
        from ssl_rec.cli import main

        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        message = [line for line in err.splitlines() if "ssl-rec: error:" in line]
        assert len(message) == 1 and "Traceback" not in err, err
        for part in parts:
            assert part in message[0], (part, message[0])
        return message[0]

    return refuses


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the session's W&B, HF and preprocessing caches (a run leaves nothing in /tmp)."""
    shutil.rmtree(_SESSION_DIR, ignore_errors=True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False, help="run slow tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow"):
        return
    skip_slow = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)
