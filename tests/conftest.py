"""Shared pytest setup: offline W&B/HF, per-session caches, the slow marker."""

from __future__ import annotations

import os
import tempfile

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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False, help="run slow tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow"):
        return
    skip_slow = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)
