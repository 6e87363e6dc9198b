"""Shard-local construction: declared tables, each shard allocating and initializing its rows.

In-process tests pin the initial rows (unchanged from the whole-table scheme, the same for
every split, also on a memory-mapped store), the declared collection and the out-of-memory
message. The torchrun tests (``workers/shard_local.py``) shard a declared model over 2
processes, and train one whose tables exceed a per-process memory limit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from ssl_rec.cli.errors import guarded
from ssl_rec.distributed.cyclic_layout import shard_rows, split_table
from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec, declare_tables
from ssl_rec.hardware.quantization import quantize_rows
from ssl_rec.hardware.table import EmbeddingTable, RowShard
from ssl_rec.hardware.table_allocation import TableMemoryError

ROWS = 70_001  # two init chunks, the last one partial


def _whole_table_init(rows: int, dim: int, spec: TableSpec, stream: int, seed: int,
                      std: float) -> torch.Tensor:  # fmt: skip
    """The store the whole-table init wrote before shards existed (one stream, 65536-row chunks)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + stream)
    chunks = [quantize_rows(torch.randn(min(65536, rows - s), dim, generator=gen) * std,
                            spec.precision) for s in range(0, rows, 65536)]  # fmt: skip
    return torch.cat(chunks)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8", "int4", "int2"])
def test_whole_table_init_is_unchanged_and_shards_draw_the_same_rows(precision: str) -> None:
    spec = TableSpec(precision, 0.05, optimizer="rowwise_adagrad")
    whole = EmbeddingTable(ROWS, 16, spec, stream=3)
    whole.init_normal(0.05, seed=7)
    assert torch.equal(whole.store, _whole_table_init(ROWS, 16, spec, 3, 7, 0.05))
    for n in (2, 3):
        for j in range(n):
            shard = EmbeddingTable(shard_rows(ROWS, n, j), 16, spec, stream=3,
                                   shard=RowShard(j, n))  # fmt: skip
            shard.init_normal(0.05, seed=7, logical_rows=ROWS)
            assert torch.equal(shard.store, whole.store[j::n]), (n, j)


def test_a_declared_table_splits_into_allocated_shards_with_the_whole_tables_rows(
    tmp_path: Path,
) -> None:
    spec = TableSpec("int8", 0.05, "lru", "rowwise_adagrad", store_dir=str(tmp_path))
    declared = EmbeddingTable(4096, 8, spec, stream=1, name="C1", meta=True)
    assert declared.declared and declared.store.is_meta and declared.cache.rows.is_meta
    whole = EmbeddingTable(4096, 8, spec, stream=1)
    whole.init_normal(0.05, seed=2)
    for j in range(2):
        shard = split_table(declared, 2, j, init=(0.05, 2))
        assert shard.num_rows == 2048 and shard.cache.sets == whole.cache.sets // 2
        assert not shard.declared and shard.name == "C1"
        assert torch.equal(shard.store, whole.store[j::2])
        assert bool((shard.cache.tags == -1).all()) and not bool(shard.momentum.any())
    with pytest.raises(ValueError, match="'C1' is declared only"):
        split_table(declared, 2, 0)


def test_a_declared_collection_allocates_at_first_use_with_the_same_values() -> None:
    specs = [TableSpec("int8", 0.1), TableSpec("fp32", optimizer="rowwise_adagrad")]
    allocated = MixedPrecisionEmbeddingCollection([300, 70_000], 8, specs, seed=4)
    with declare_tables():
        declared = MixedPrecisionEmbeddingCollection([300, 70_000], 8, specs, seed=4)
        loaded = MixedPrecisionEmbeddingCollection([300, 70_000], 8, specs, seed=5)
    assert declared.declared and all(t.store.is_meta for t in declared.group.tables)
    declared.cpu().train()  # what Lightning does before any step: nothing to move yet
    ids = torch.tensor([[1, 2], [299, 69_999]])
    assert torch.equal(declared(ids), allocated.train()(ids))
    assert not declared.declared
    ours, theirs = declared.state_dict(), allocated.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours if isinstance(ours[k], torch.Tensor))
    loaded.load_state_dict(theirs)  # held pending, loaded when the tables are allocated
    assert loaded.declared
    loaded.allocate()
    assert torch.equal(loaded.group.tables[1].store, allocated.group.tables[1].store)


def test_a_table_that_does_not_fit_names_itself_and_is_one_command_line_error(capsys) -> None:
    with declare_tables():
        huge = MixedPrecisionEmbeddingCollection([16, 1 << 42], 64, TableSpec("fp32"),
                                                 table_names=["small", "huge"])  # fmt: skip
    with pytest.raises(TableMemoryError, match=r"table 'huge': out of memory allocating its "
                       r"store \(4398046511104 rows x 64, fp32\)"):  # fmt: skip
        huge.allocate()
    assert huge.declared  # nothing half-built was kept

    def command(args: list[str]) -> None:
        huge.allocate()

    with pytest.raises(SystemExit) as exit_info:
        guarded(command, [])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ssl-rec: error: table 'huge': out of memory")


WORKERS = Path(__file__).resolve().parent / "workers"


def torchrun(*args: str, timeout: float = 300) -> list[dict]:
    """``workers/shard_local.py`` on 2 torchrun processes: its RESULT lines."""
    pytest.importorskip("torchrec", reason="scale-out needs the optional dist install")
    sys.path.insert(0, str(WORKERS))
    from test_multiprocess import torchrun as run

    return run("shard_local.py", *args, timeout=timeout)


def test_each_rank_allocates_only_its_rows_with_the_unsharded_initial_values() -> None:
    [run] = torchrun("check")
    assert run["never_allocated"], "the declared collection was allocated whole"
    assert run["identical_init"], "a shard's initial rows differ from the unsharded table's"
    assert sum(run["rows_held"]) == run["total_rows"]
    assert all(held < 0.6 * run["total_rows"] for held in run["rows_held"]), run["rows_held"]
    assert run["losses"] == run["allocated_losses"]  # trains like tables allocated whole


@pytest.mark.slow
def test_tables_over_one_process_memory_limit_train_on_two_and_fail_clearly_on_one() -> None:
    [two] = torchrun("memory", timeout=420)
    assert two["outcome"] == "trained" and len(two["losses"]) == 3, two
    assert two["held_bytes"] <= 0.51 * two["table_bytes"]
    one = _run_one_process(WORKERS)
    assert one["outcome"] == "error" and one["type"] == "TableMemoryError", one
    assert one["message"].startswith("table 'C") and "out of memory" in one["message"]


def _run_one_process(workers: Path) -> dict:
    import json
    import os
    import subprocess

    root = workers.parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([sys.executable, str(workers / "shard_local.py"), "memory"],
                          capture_output=True, text=True, timeout=300, env=env,
                          cwd=workers)  # fmt: skip
    results = [json.loads(line[len("RESULT ") :]) for line in done.stdout.splitlines()
               if line.startswith("RESULT ")]  # fmt: skip
    assert results, f"no result:\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}"
    return results[0]
