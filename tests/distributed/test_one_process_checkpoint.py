"""A one-process checkpoint file into 2 sharded processes, no rank holding a whole table.

In-process tests pin the mapped read (tables are read-only views of the file, the rest
ordinary memory) and the pending values of declared tables (``init_from`` into a declared
model, allocated later, equals the whole load). The torchrun tests
(``workers/one_process_ckpt.py``) load a file written by one process into 2 processes with
``init_from`` and by resuming it, and do both under a per-process memory limit below the
tables' size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ssl_rec.hardware import declare_tables
from ssl_rec.lightning.mapped_checkpoint import map_checkpoint_file

WORKERS = Path(__file__).resolve().parent / "workers"
sys.path.insert(0, str(WORKERS))


def _write(out: Path, scale: float, timeout: float = 300) -> dict:
    """``one_process_ckpt.py write``: one process, no limit; its RESULT line."""
    root = WORKERS.parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([sys.executable, str(WORKERS / "one_process_ckpt.py"), "write",
                           str(out), str(scale)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=WORKERS)  # fmt: skip
    results = [json.loads(line[len("RESULT ") :]) for line in done.stdout.splitlines()
               if line.startswith("RESULT ")]  # fmt: skip
    assert results, f"no result:\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}"
    return results[0]


def _vm_data() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmData:"))


def _ctr(init_from: Path | None = None, transfer: str = "backbone"):
    from functools import partial

    from ssl_rec.hardware import TableSpec
    from ssl_rec.lightning import CTRModule
    from ssl_rec.models import Backbone
    from ssl_rec.schema import CategoricalField, FeatureSchema

    torch.manual_seed(0)
    schema = FeatureSchema(["I1"], [CategoricalField("C1", 100_000), CategoricalField("C2", 300)],
                           "label")  # fmt: skip
    spec = TableSpec("int8", 0.1, optimizer="rowwise_adagrad")
    return CTRModule(partial(Backbone, embedding_dim=16, tables=spec), schema.to_dict(),
                     init_from=None if init_from is None else str(init_from),
                     transfer=transfer)  # fmt: skip


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A CTR checkpoint whose tables moved from their initial values (rows and momentum)."""
    module = _ctr()
    tables = module.backbone.embedding.tables
    tables.train()
    tables(torch.randint(0, 300, (256, 2))).square().sum().backward()
    path = tmp_path / "one.ckpt"
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": {}}, path)
    return path


def test_a_mapped_file_leaves_the_tables_in_the_file_and_copies_the_rest(saved: Path) -> None:
    before = _vm_data()
    mapped = map_checkpoint_file(saved)["state_dict"]
    grown = _vm_data() - before
    whole = torch.load(saved, map_location="cpu", weights_only=True)["state_dict"]
    assert mapped.keys() == whole.keys()
    tensors = [k for k, v in whole.items() if isinstance(v, torch.Tensor)]
    assert all(torch.equal(mapped[k], whole[k]) for k in tensors)
    table_bytes = sum(whole[k].nbytes for k in tensors if ".group.tables." in k)
    assert grown < table_bytes / 2, (grown, table_bytes)  # a read-only shared mapping
    dense = next(k for k in mapped if k.startswith("head."))
    mapped[dense].add_(1.0)  # copied: writable, and the file is unchanged
    again = torch.load(saved, map_location="cpu", weights_only=True)["state_dict"]
    assert torch.equal(again[dense], whole[dense])


@pytest.mark.parametrize("transfer", ["backbone", "tables"])
def test_init_from_into_declared_tables_keeps_them_pending_until_allocated(
    saved: Path, transfer: str
) -> None:
    loaded = _ctr(saved, transfer)
    with declare_tables():
        declared = _ctr(saved, transfer)
    tables = declared.backbone.embedding.tables
    assert tables.declared and tables._pending is not None  # nothing allocated yet
    assert all(t.store.is_meta for t in tables.group.tables)
    ours, theirs = declared.state_dict(), loaded.state_dict()  # allocates: pending loaded
    assert not tables.declared and tables._pending is None
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours if isinstance(ours[k], torch.Tensor))
    saved_store = torch.load(saved, weights_only=True)["state_dict"]
    key = "backbone.embedding.tables.group.tables.0.store"
    assert torch.equal(ours[key], saved_store[key])
    assert not ours["backbone.embedding.tables.group.tables.0.momentum"].any()  # reset


def torchrun(*args: str, timeout: float = 300) -> list[dict]:
    """``workers/one_process_ckpt.py`` on 2 torchrun processes: its RESULT lines."""
    pytest.importorskip("torchrec", reason="scale-out needs the optional dist install")
    from test_multiprocess import torchrun as run

    return run("one_process_ckpt.py", *args, timeout=timeout)


def test_a_one_process_file_starts_and_resumes_two_processes_with_its_rows(
    tmp_path: Path,
) -> None:
    _write(tmp_path, 0.001)
    [run] = torchrun("check", str(tmp_path))
    assert run["init_pending"] and run["never_allocated"], run
    assert run["init_starts_equal"], "a shard's rows differ from the whole init_from load's"
    assert run["losses"] == run["whole_losses"]  # trains like the tables loaded whole
    assert run["resume_starts_equal"], "a resumed shard's rows differ from the checkpoint's"
    assert run["resumed_step"] == 4 and len(run["resumed_losses"]) == 2, run


@pytest.mark.slow
def test_a_file_over_one_process_memory_limit_starts_and_resumes_two(tmp_path: Path) -> None:
    written = _write(tmp_path, 0.1, timeout=420)
    for phase in ("init_from", "resume"):
        [two] = torchrun("memory", str(tmp_path), "0.1", phase, timeout=420)
        assert two["outcome"] == "trained", two
        assert two["table_bytes"] == written["table_bytes"]
        assert two["held_bytes"] <= 0.51 * two["table_bytes"], two
        assert two["step"] == 3 and len(two["losses"]) == (3 if phase == "init_from" else 1)
