"""pytest setup of the doctests of ``ssl_rec`` (``--doctest-modules``, see ``pyproject.toml``).

A module that needs an optional stack (TorchRec, torchao, FBGEMM) this environment lacks is
not collected, so ``pytest`` runs without them; every doctest runs in its own scratch
directory, so examples write files under plain names (``pred.csv``) as a user would. Under
``tests/`` only test files are collected: helpers and worker scripts (run by ``torchrun``)
hold no doctests and are not imported for them.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
PACKAGE, TESTS = ROOT / "ssl_rec", ROOT / "tests"
OPTIONAL_STACKS = frozenset({"torchrec", "torchao", "fbgemm_gpu", "tensordict"})


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave out test helpers, and modules of ``ssl_rec`` whose optional stack is missing."""
    if collection_path.suffix != ".py":
        return None
    if TESTS in collection_path.parents:
        name = collection_path.name
        return None if name.startswith("test_") or name == "conftest.py" else True
    if PACKAGE not in collection_path.parents:
        return None
    try:
        importlib.import_module(_module_name(collection_path))
    except ModuleNotFoundError as e:
        if (e.name or "").partition(".")[0] in OPTIONAL_STACKS:
            return True
    except Exception:  # the doctest collection reports it, with its traceback
        return None
    return None


@pytest.fixture(autouse=True)
def _doctest_scratch_directory(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run each doctest of ``ssl_rec`` in a fresh temporary directory."""
    if PACKAGE in Path(str(request.node.path)).parents:
        monkeypatch.chdir(request.getfixturevalue("tmp_path"))
