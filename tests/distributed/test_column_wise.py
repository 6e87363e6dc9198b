"""Column-wise tables on two gloo processes: exact against one process, checkpoints both ways.

The worker trains INT8 + 5% cache tables with column blocks split over the ranks
(``column_wise``), held whole, replicated (``data_parallel``) and row-wise, 50 steps, beside
one process training the unsharded tables on the concatenated batches (see
``workers/column_wise.py``). The replica sums its gradients per row on each rank before the
all-reduce: its cache decisions are one process's, its values within rounding of them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torchrec", reason="scale-out needs the optional dist install (make dist)")

sys.path.insert(0, str(Path(__file__).resolve().parent / "workers"))

from column_wise import STEPS  # noqa: E402
from test_multiprocess import torchrun  # noqa: E402


def test_column_wise_tables_train_like_one_process(tmp_path: Path) -> None:
    (run,) = torchrun("column_wise.py", str(tmp_path))
    assert set(run["types"].values()) == {"column_wise", "data_parallel", "table_wise",
                                          "row_wise"}  # fmt: skip
    assert len(run["losses"]) == len(run["reference_losses"]) == STEPS
    # The tables train bit for bit (the replica within rounding); the losses differ by the
    # order of the sums only.
    gap = max(abs(a - b) for a, b in zip(run["losses"], run["reference_losses"], strict=True))
    assert gap <= 1e-6, f"loss gap {gap} over {STEPS} steps"
    assert run["losses"][-1] < run["losses"][0]
    assert run["replica_decisions_same"], "the replica's cache admitted other rows"
    assert run["replica_value_gap"] <= 1e-5 and run["replica_momentum_gap"] <= 1e-5
    assert run["shards_match"], "a shard's state differs from its blocks of one process's table"
    assert run["lookup_same"] and run["weights_same"]
    assert run["checkpoint_in_one_process"], "the sharded checkpoint read in one process differs"
    assert run["checkpoint_resharded"], "the sharded checkpoint loaded back differs"
    assert run["one_process_state_sharded"], "one process's state loaded sharded differs"
    assert run["pending_state_sharded"], "one process's file loaded into declared tables differs"
