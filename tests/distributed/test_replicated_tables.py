"""Data-parallel (replicated) tables on two gloo processes: exact, and replicas bit-identical.

The worker trains the parity model with every small table replicated on both ranks (the
others row-split or whole), on the same 50 global batches as one process training the
unsharded tables, and the same tables alone (no dense layers) beside one process; its
``RESULT`` lines carry the losses and the replica checks. Each backward passes one ``[U, D]``
gradient per replicated table along the ranks and broadcasts it, ``U`` the global batch's
unique ids of the table, not the ``[W * B, D]`` per-sample gradients.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torchrec", reason="scale-out needs the optional dist install (make dist)")

sys.path.insert(0, str(Path(__file__).resolve().parent / "workers"))

from common import SPECS, data, model, part  # noqa: E402
from parity import GLOBAL_BATCH, STEPS, train  # noqa: E402
from test_multiprocess import torchrun  # noqa: E402

# The FP32 tables train bit for bit; what is left is the dense all-reduce's rounding (as in
# test_multiprocess.py), which a stochastically rounded INT8 write can turn into a level.
TOLERANCE = {"fp32": 1e-5, "int8_cache5": 2e-4}


@pytest.mark.slow
def test_replicated_tables_match_one_process_and_stay_identical() -> None:
    runs = {r["tables"]: r for r in torchrun("replicated.py")}
    schema, rows = data("train", STEPS * GLOBAL_BATCH)
    assert set(runs) == set(SPECS)
    for tables, run in runs.items():
        assert len(run["replicated"]) >= 10 and "data_parallel" in run["types"].values()
        assert run["replicas_identical"], f"{tables}: replicas differ across ranks"
        assert run["reload_identical"], f"{tables}: state_dict reload changed a replica"
        # Per backward rank 0 sends one message of exactly the global batch's unique rows
        # times D and receives it back by one broadcast.
        assert run["sent"] == run["unique_floats"], f"{tables}: replica comm is not [U, D]"
        assert run["broadcast"] == run["unique_floats"]
        assert max(run["sent"]) < run["sample_floats"] / 2
        # The tables alone: every sample's loss and every replica's bytes are one process's.
        assert run["tables_only"] == {"samples_same": True, "replicas_same": True}, tables
        if tables == "int8_cache5":  # cached INT8 replicas: their caches admit and hit
            assert run["cache_rows"] > 0 and run["cache_hits"] > 0
        ctr = model(schema, SPECS[tables]).train()
        reference = train(ctr, lambda s: part(rows, s * GLOBAL_BATCH, (s + 1) * GLOBAL_BATCH),
                          1, 0)  # fmt: skip
        gap = max(abs(a - b) for a, b in zip(run["losses"], reference, strict=True))
        assert gap <= TOLERANCE[tables], f"{tables}: loss gap {gap} over {STEPS} steps"
        print(
            f"{tables}: loss gap {gap:.2e}, replica message {max(run['sent'])} floats "
            f"of at most {run['sample_floats']} per-sample gradient floats"
        )
