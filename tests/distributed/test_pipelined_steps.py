"""Pipelined sharded steps (the next batch's input dist during the current step) are exact.

Two gloo processes: 50 steps unpipelined, pipelined, and pipelined with prefetches that a
forward cannot use (other ids on one rank, none on the other) must give the same per-step
losses and table bytes, bit for bit. Through Lightning, ``ShardedTablesStrategy(pipeline=
True)`` fits with the unpipelined fit's losses and checkpoint, also when resumed mid-epoch.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchrec", reason="scale-out needs the optional dist install (make dist)")

sys.path.insert(0, str(Path(__file__).resolve().parent / "workers"))

from parity import STEPS  # noqa: E402
from test_multiprocess import torchrun  # noqa: E402

from ssl_rec.lightning import read_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "dist" / "synthetic_int8_row_wise.yaml"
BATCH, FIT_STEPS, RESUME_AT = 128, 50, 23  # per rank; an epoch has 64 steps


def test_pipelined_steps_equal_unpipelined_steps_over_50_steps() -> None:
    runs = {r["setup"]: r for r in torchrun("pipelined.py")}
    assert set(runs) == {"int8_cache5/row_wise", "fp32/replicated"}
    for setup, run in runs.items():
        off = run["losses"]["off"]
        assert len(off) == STEPS
        for mode in ("on", "perturbed"):
            assert run["losses"][mode] == off, f"{setup} {mode}: losses differ"
            assert run["losses_equal"][mode], f"{setup} {mode}: losses differ on a rank"
            assert run["tables_equal"][mode], f"{setup} {mode}: tables differ on a rank"
        assert run["counts"]["on"] == {"used": STEPS - 1, "discarded": 0}
        # 5 steps prefetch other ids on one rank (discarded), 5 none on the other (not started)
        assert run["counts"]["perturbed"] == {"used": STEPS - 11, "discarded": 5}


def _fit(run: Callable, out: Path, cache: Path, *extra: str) -> tuple[list[float], list[dict]]:
    """Fit the shipped row-wise config on 2 processes (torchrun).

    Returns:
        The per-step losses, and each rank's counts of input dists run ahead (pipelined).

    """
    args = ["fit", "--config", str(CONFIG), "--trainer.devices", "2",
            "--trainer.max_epochs", "1", "--trainer.limit_val_batches", "0",
            "--trainer.log_every_n_steps", "1",
            "--trainer.logger", "pytorch_lightning.loggers.CSVLogger",
            "--trainer.logger.save_dir", str(out), "--trainer.default_root_dir", str(out),
            "--data.init_args.n_train", str(2 * BATCH * 64),
            "--data.init_args.n_val", "256", "--data.init_args.n_test", "256",
            "--data.init_args.batch_size", str(BATCH),
            "--data.init_args.cache_dir", str(cache),
            "--trainer.callbacks+=tests.distributed.workers.ahead_probe.AheadProbe",
            *extra]  # fmt: skip
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", "-m", "ssl_rec.cli.main", *args]  # fmt: skip
    done = run(command, 300)
    assert done.returncode == 0, f"fit failed:\n{done.stdout[-6000:]}"
    losses = {}
    for metrics in sorted(out.glob("lightning_logs/version_*/metrics.csv")):
        for row in csv.DictReader(metrics.open()):
            if row.get("train/loss"):
                losses[int(row["step"])] = float(row["train/loss"])
    ahead = [json.loads(path.read_text()) for path in out.glob("ahead_rank*.json")]
    return [losses[s] for s in sorted(losses)], sorted(ahead, key=lambda c: c["rank"])


def _tables(checkpoint: Path) -> dict[str, torch.Tensor]:
    state = read_checkpoint(checkpoint)["state_dict"]
    return {k: v for k, v in state.items() if ".tables." in k and isinstance(v, torch.Tensor)}


@pytest.mark.slow
def test_pipelined_fit_equals_unpipelined_fit_and_resumes(tmp_path: Path, run_launched) -> None:
    cache, steps = tmp_path / "cache", f"--trainer.max_steps={FIT_STEPS}"
    on = "--trainer.strategy.pipeline=true"
    # A checkpoint inside the epoch, written with the next batch read and its ids in flight.
    mid = ["--trainer.callbacks+=pytorch_lightning.callbacks.ModelCheckpoint",
           f"--trainer.callbacks.every_n_train_steps={RESUME_AT}",
           "--trainer.callbacks.save_top_k=-1", "--trainer.callbacks.filename={step}",
           f"--trainer.callbacks.dirpath={tmp_path / 'steps'}"]  # fmt: skip
    plain, _ = _fit(run_launched, tmp_path / "off", cache, steps)
    piped, ahead = _fit(run_launched, tmp_path / "on", cache, steps, on, *mid)
    assert len(plain) == FIT_STEPS and piped == plain
    assert [(c["used"], c["discarded"]) for c in ahead] == [(FIT_STEPS - 1, 0)] * 2
    last = "checkpoints/last.ckpt"
    reference = _tables(tmp_path / "off" / last)
    assert reference and _tables(tmp_path / "on" / last).keys() == reference.keys()
    assert all(torch.equal(v, reference[k]) for k, v in _tables(tmp_path / "on" / last).items())
    start = tmp_path / "steps" / f"step={RESUME_AT}.ckpt"
    resumed, ahead = _fit(run_launched, tmp_path / "resumed", cache, steps, on,
                          "--ckpt_path", str(start))  # fmt: skip
    assert resumed == plain[RESUME_AT:]
    # The resumed fit's first step runs its own input dist (nothing was in flight for it).
    assert [(c["used"], c["discarded"]) for c in ahead] == [(FIT_STEPS - RESUME_AT - 1, 0)] * 2
    tables = _tables(tmp_path / "resumed" / last)
    assert tables.keys() == reference.keys()
    assert all(torch.equal(v, reference[k]) for k, v in tables.items())
