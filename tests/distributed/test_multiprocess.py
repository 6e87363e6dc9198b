"""Two gloo processes on this machine: sharded training, checkpoints, and plain DDP.

Each test starts ``torchrun`` in a subprocess with a timeout and reads the workers'
``RESULT`` lines (a rare abort at interpreter exit after the result must not fail a test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchrec", reason="scale-out needs the optional dist install (make dist)")

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"
sys.path.insert(0, str(WORKERS))

from common import SPECS, data, model, part  # noqa: E402
from parity import GLOBAL_BATCH, STEPS, TEST_ROWS, evaluate_auc, train  # noqa: E402

from ssl_rec.lightning import read_checkpoint  # noqa: E402


def torchrun(worker: str, *args: str, timeout: float = 300) -> list[dict]:
    """Run ``worker`` on 2 processes; return its RESULT lines (fail with its output if none)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", str(WORKERS / worker), *args]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=WORKERS)  # fmt: skip
    results = [json.loads(line[len("RESULT ") :]) for line in done.stdout.splitlines()
               if line.startswith("RESULT ")]  # fmt: skip
    assert results, f"no result from {worker}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return results


def test_sharded_training_matches_one_process_with_the_same_global_batch() -> None:
    sharded = torchrun("parity.py")
    schema, rows = data("train", STEPS * GLOBAL_BATCH)
    _, test = data("test", TEST_ROWS)

    def step_batch(step: int):
        return part(rows, step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)

    reference = {}
    for tables, spec in SPECS.items():
        ctr = model(schema, spec).train()
        reference[tables] = (train(ctr, step_batch, 1, 0), evaluate_auc(ctr, test, 1, 0))
    assert {(r["tables"], r["sharding"], r["comms"]) for r in sharded} >= {
        (t, s, "fp32") for t in SPECS for s in ("table_wise", "row_wise")
    }
    for run in sharded:
        losses, auc = reference[run["tables"]]
        assert len(run["losses"]) == STEPS
        if run["comms"] == "fp32":
            gap = max(abs(a - b) for a, b in zip(run["losses"], losses, strict=True))
            # The tables train bit for bit (tests/distributed/test_layout.py); the loss gap is
            # the dense all-reduce's rounding over 50 steps (6e-8 with FP32 tables), which a
            # stochastically rounded store write can turn into a whole quantization level:
            # 1.9e-5 when every miss entered the FP32 cache, 9.3e-5 with admission count 2
            # (rows seen once are updated in the INT8 store).
            assert gap <= 2e-4, f"{run['tables']} {run['sharding']}: loss gap {gap}"
        else:
            assert abs(run["auc"] - auc) <= 5e-4, (
                f"{run['comms']} comms move AUC {auc} -> {run['auc']}"
            )
        if run["sharding"] == "row_wise":  # the big tables really are split
            assert "row_wise" in run["types"].values()


def test_checkpoint_saved_on_two_ranks_reshards_and_loads_on_one(tmp_path: Path) -> None:
    [result] = torchrun("ckpt.py", str(tmp_path))
    assert result["steps"] == result["resumed_step"] == 8
    assert result["reshard_max_diff"] == 0.0  # row-wise save, table-wise reload, 2 ranks
    checkpoint = read_checkpoint(tmp_path / "ckpt")
    schema, _ = data("train", 8)
    module = model(schema, SPECS["int8_cache5"])
    module.load_state_dict(checkpoint["state_dict"])
    module.eval()
    with torch.no_grad():
        logits = module(part(data("test", 512)[1], 0, 512))
    assert torch.equal(logits, torch.load(tmp_path / "pred.pt"))


def test_plain_ddp_refuses_models_with_tables(tmp_path: Path) -> None:
    """Plain DDP used to crash on the int16 cache tags (gloo) or overwrite rank 1's tables."""
    [result] = torchrun("plain_ddp.py", str(tmp_path))
    assert result["outcome"] == "error" and result["type"] == "ValueError", result
    assert "ShardedTablesStrategy" in result["message"]
