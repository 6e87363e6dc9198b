"""Resume is explicit about configuration, and a run directory holds one fit at a time."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import yaml
from cli_outcome import error_line, synthetic_fit

from ssl_rec.cli import main
from ssl_rec.cli.fit_guard import ConfiguredOptimizers
from ssl_rec.cli.lightning_cli import SSLRecCLI
from ssl_rec.cli.run_dir import (
    LOCK_FILENAME,
    RunDirectoryBusy,
    is_global_rank_zero,
    lock_run,
    release_run,
)

BACKBONE = "--model.init_args.backbone.init_args"


def _resume(cache: Path, root: Path, *extra: str) -> list[str]:
    return synthetic_fit(cache, root, f"--ckpt_path={root / 'checkpoints' / 'last.ckpt'}", *extra)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """``(cache_dir, run_dir)`` of a one-step fit (FP32 tables, D = 16, lr 0.001)."""
    base = tmp_path_factory.mktemp("resume")
    cache, root = base / "cache", base / "run"
    main(synthetic_fit(cache, root, "--trainer.max_steps=1"))
    return cache, root


STRUCTURAL = {
    "embedding_dim": (f"{BACKBONE}.embedding_dim=32",
                      ["model.init_args.backbone.init_args.embedding_dim 32", "(checkpoint: 16)"]),
    "table precision": (f"{BACKBONE}.tables.precision=int8",
                        ["backbone.init_args.tables.precision int8", "(checkpoint: fp32)"]),
    "table override": (
        f"{BACKBONE}.table_overrides={{C1: {{precision: int8}}}}",
        ["backbone.init_args.table_overrides.C1.precision int8", "(checkpoint: null)"],
    ),
    "encoder layers": (f"{BACKBONE}.encoder.init_args.top=[64,32]",
                       ["encoder.init_args.top [64,32]", "(checkpoint: [256,128])"]),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(STRUCTURAL))
def test_a_structural_change_on_resume_is_refused_in_one_line(trained, case, capsys) -> None:
    cache, root = trained
    override, expected = STRUCTURAL[case]
    ckpt = root / "checkpoints" / "last.ckpt"
    before = (ckpt.stat().st_mtime_ns, (root / "config.yaml").read_text())
    with pytest.raises(SystemExit) as exit_info:
        main(_resume(cache, root, override))
    assert exit_info.value.code == 2
    line = error_line(capsys.readouterr().err)
    assert f"cannot resume {ckpt}" in line, line
    for part in expected:
        assert part in line, (part, line)
    # nothing ran: the checkpoint and the run's config.yaml are as the first fit left them
    assert (ckpt.stat().st_mtime_ns, (root / "config.yaml").read_text()) == before


def test_non_structural_overrides_are_applied_logged_and_recorded(trained, tmp_path, capsys):
    cache, _ = trained
    root, batches = tmp_path / "run", "--data.init_args.batch_size=128"  # 4 steps an epoch
    main(synthetic_fit(cache, root, batches, "--trainer.max_steps=1"))
    capsys.readouterr()
    lr, steps = "--model.init_args.learning_rate=0.01", "--trainer.max_steps=2"
    main(_resume(cache, root, batches, lr, steps))
    err = capsys.readouterr().err
    changes = [line for line in err.splitlines() if line.startswith("resuming with")]
    # exactly the two given: defaults both sides share are no difference
    assert changes == [
        "resuming with trainer.max_steps 2 (previous run, config.yaml: 1)",
        "resuming with model.init_args.learning_rate 0.01 (checkpoint: 0.001)",
    ], err
    config = yaml.safe_load((root / "config.yaml").read_text())
    assert config["model"]["init_args"]["learning_rate"] == 0.01
    assert config["trainer"]["max_steps"] == 2
    saved = torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 2
    assert saved["hyper_parameters"]["learning_rate"] == 0.01
    # the restored Adam stepped with the command's learning rate, not the checkpoint's
    assert [g["lr"] for g in saved["optimizer_states"][0]["param_groups"]] == [0.01]


def test_configured_optimizers_keep_a_scheduled_learning_rate() -> None:
    """With a learning-rate scheduler the restored (scheduled) rates are left alone."""

    class Trainer:
        lr_scheduler_configs = [object()]
        optimizers = [torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)]

    ConfiguredOptimizers().on_train_start(Trainer(), None)  # type: ignore[arg-type]
    assert Trainer.optimizers[0].param_groups[0]["lr"] == 0.5


def _hold_lock(root: Path) -> subprocess.Popen:
    """A process holding the run lock of ``root`` until killed, as a running fit does.

    It takes the lock as :func:`lock_run` does, without importing Lightning (seconds here).
    """
    root.mkdir(parents=True, exist_ok=True)
    code = (
        "import filelock, os, socket, sys, time; path = sys.argv[1]; "
        "lock = filelock.FileLock(path, timeout=0); lock.acquire(); "
        "open(path, 'w').write(f'pid {os.getpid()} on {socket.gethostname()}\\n'); "
        "print('held', flush=True); time.sleep(120)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(root / LOCK_FILENAME)],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_fit_into_a_busy_run_directory_is_refused(trained, tmp_path, capsys) -> None:
    cache, _ = trained
    root = tmp_path / "busy"
    holder = _hold_lock(root)
    try:
        with pytest.raises(SystemExit) as exit_info:
            main(synthetic_fit(cache, root, "--trainer.max_steps=1"))
        assert exit_info.value.code == 2
        line = error_line(capsys.readouterr().err)
        assert f"{root} is in use by another fit (pid {holder.pid} on " in line, line
        assert not (root / "checkpoints").exists()  # the refused fit wrote nothing
    finally:
        holder.kill()
        holder.wait(timeout=30)
    # the holder died without releasing: the operating system did (flock)
    locks = lock_run([root])
    assert (root / LOCK_FILENAME).read_text() == f"pid {os.getpid()} on {socket.gethostname()}\n"
    release_run(locks)


def test_the_run_lock_is_held_during_the_fit_and_released_after(
    trained, tmp_path, monkeypatch
) -> None:
    cache, _ = trained
    root = tmp_path / "run"
    seen: list[str] = []

    class TryLock(pl.Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            try:
                release_run(lock_run([root]))
                seen.append("free")
            except RunDirectoryBusy as e:
                seen.append(str(e))

    original = SSLRecCLI.after_instantiate_classes

    def with_probe(self) -> None:
        original(self)
        self.trainer.callbacks.append(TryLock())

    monkeypatch.setattr(SSLRecCLI, "after_instantiate_classes", with_probe)
    main(synthetic_fit(cache, root, "--trainer.max_steps=1"))
    assert len(seen) == 1 and f"(pid {os.getpid()} on " in seen[0], seen
    release_run(lock_run([root]))  # free once the command returned
    assert (root / LOCK_FILENAME).read_text() == ""


@pytest.mark.parametrize(
    ("env", "zero"),
    [({}, True), ({"RANK": "0", "LOCAL_RANK": "0"}, True), ({"RANK": "3"}, False),
     ({"LOCAL_RANK": "1"}, False), ({"NODE_RANK": "1", "LOCAL_RANK": "0"}, False)],
)  # fmt: skip
def test_only_the_first_process_of_a_distributed_run_takes_the_lock(monkeypatch, env, zero):
    for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID",
                 "JSM_NAMESPACE_RANK"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert is_global_rank_zero() is zero
