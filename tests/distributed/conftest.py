"""``run_launched``: a multi-process command run in its own session, cut off whole on timeout."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A launcher's variables left by an enclosing run would make the child join that world.
LAUNCHER_ENV = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
                "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK")  # fmt: skip


def _run_launched(command: list[str], timeout: float, **env: str) -> subprocess.CompletedProcess:
    """Run ``command`` from the repository root in its own session, output merged into stdout.

    No launcher variables are inherited; one thread per process; ``env`` adds variables. On
    timeout the whole session (the launcher's children too) is killed and the test fails
    with the output's tail.
    """
    child_env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    child_env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), WANDB_MODE="offline", **env)
    proc = subprocess.Popen(command, cwd=ROOT, env=child_env, stdout=subprocess.PIPE, text=True,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{command[:4]} did not finish in {timeout} s:\n{out[-4000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, out)


@pytest.fixture(scope="session")
def run_launched() -> Callable[..., subprocess.CompletedProcess]:
    """``run_launched(command, timeout, **env)`` runs a multi-process command (see above)."""
    return _run_launched
