"""Column-wise tables on two gloo processes: exact against one process, checkpoints both ways.

The worker trains INT8 + 5% cache tables with column blocks split over the ranks
(``column_wise``), held whole, replicated (``data_parallel``) and row-wise, 50 steps, beside
one process training the unsharded tables on the concatenated batches (see
``workers/column_wise.py``): every table, the replica included, trains bit for bit.
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
    # The tables train bit for bit, the replica's sums too (they follow the sample order
    # along the ranks): every sample's loss of every step is one process's, and so is each
    # step's loss (the mean of the gathered sample losses).
    assert run["sample_losses_same"], "a sample's loss differs from one process's"
    assert run["losses"] == run["reference_losses"]
    assert run["losses"][-1] < run["losses"][0]
    assert run["replica_decisions_same"], "the replica's cache admitted other rows"
    assert run["replica_bytes_same"], "the replica's store, cache or optimizer state differs"
    assert run["replica_value_gap"] == 0.0 and run["replica_momentum_gap"] == 0.0
    assert run["shards_match"], "a shard's state differs from its blocks of one process's table"
    assert run["lookup_same"] and run["weights_same"]
    assert run["checkpoint_in_one_process"], "the sharded checkpoint read in one process differs"
    assert run["checkpoint_resharded"], "the sharded checkpoint loaded back differs"
    assert run["one_process_state_sharded"], "one process's state loaded sharded differs"
    assert run["pending_state_sharded"], "one process's file loaded into declared tables differs"
