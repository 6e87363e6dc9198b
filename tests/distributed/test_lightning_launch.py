"""``ssl-rec fit --trainer.devices 2`` without torchrun: Lightning's own launcher, gloo, CPU.

The shipped sharded config is run through the command line twice, by Lightning's subprocess
launcher and by torchrun, on a small synthetic split; both must train, validate and write the
sharded checkpoints, with the same per-step losses.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("torchrec", reason="scale-out needs the optional dist install (make dist)")

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "dist" / "synthetic_int8_row_wise.yaml"
BATCH = 256  # per rank


def fit(run: Callable, out: Path, launcher: str, steps: int, cache: Path,
        timeout: float = 240) -> dict:  # fmt: skip
    """Fit the shipped row-wise config for ``steps`` steps on 2 processes; losses and outputs.

    ``run`` is the ``run_launched`` fixture (tests/distributed/conftest.py).
    """
    args = ["fit", "--config", str(CONFIG), "--trainer.devices", "2",
            "--trainer.max_steps", str(steps), "--trainer.max_epochs", "1",
            "--trainer.val_check_interval", str(steps), "--trainer.log_every_n_steps", "1",
            "--trainer.logger", "pytorch_lightning.loggers.CSVLogger",
            "--trainer.logger.save_dir", str(out), "--trainer.default_root_dir", str(out),
            "--data.init_args.n_train", str(2 * BATCH * steps),
            "--data.init_args.n_val", "1024", "--data.init_args.n_test", "256",
            "--data.init_args.batch_size", str(BATCH),
            "--data.init_args.cache_dir", str(cache)]  # fmt: skip
    if launcher == "lightning":
        command = [sys.executable, "-m", "ssl_rec.cli.main", *args]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", "2", "-m", "ssl_rec.cli.main", *args]  # fmt: skip
    done = run(command, timeout)
    assert done.returncode == 0, f"{launcher} launch failed:\n{done.stdout[-6000:]}"
    [metrics] = out.glob("lightning_logs/version_*/metrics.csv")
    rows = list(csv.DictReader(metrics.open()))
    losses = {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}
    aucs = [float(r["val/auc"]) for r in rows if r.get("val/auc")]
    return {"losses": [losses[s] for s in sorted(losses)], "aucs": aucs,
            "checkpoints": out / "checkpoints", "log": done.stdout}  # fmt: skip


def _check_sharded_checkpoint(directory: Path) -> None:
    for name in ("last.ckpt", "best.ckpt"):
        files = {p.name for p in (directory / name).iterdir()}
        # every rank wrote its blocks, rank 0 the manifest
        assert {"__0_0.distcp", "__1_0.distcp", "ssl_rec_checkpoint.json"} <= files, files


def test_lightning_launcher_trains_validates_and_checkpoints(tmp_path: Path, run_launched) -> None:
    run = fit(run_launched, tmp_path / "lightning", "lightning", 6, tmp_path / "cache")
    assert len(run["losses"]) == 6
    assert len(run["aucs"]) == 1 and 0.5 < run["aucs"][0] <= 1.0
    _check_sharded_checkpoint(run["checkpoints"])


@pytest.mark.slow
def test_lightning_launcher_matches_torchrun_over_50_steps(tmp_path: Path, run_launched) -> None:
    lightning = fit(run_launched, tmp_path / "lightning", "lightning", 50, tmp_path / "cache")
    torchrun = fit(run_launched, tmp_path / "torchrun", "torchrun", 50, tmp_path / "cache")
    assert len(lightning["losses"]) == len(torchrun["losses"]) == 50
    gap = max(abs(a - b) for a, b in zip(lightning["losses"], torchrun["losses"], strict=True))
    assert gap <= 1e-5, f"loss gap {gap}"
    assert lightning["aucs"] and lightning["aucs"] == pytest.approx(torchrun["aucs"], abs=1e-5)
    _check_sharded_checkpoint(lightning["checkpoints"])
