"""``ssl-rec fit`` under the sharded strategy declares the tables; each rank allocates its rows.

In process: the command line builds a sharded config's model with declared tables (and a
one-process config's with allocated ones), and the resume check of ``fit --ckpt_path``
reads a declared model's shapes without allocating it. On 2 processes (Lightning's
launcher, ``workers/cli_tables.py`` recording every table each process builds): every rank
declares every table, and each table's rows are allocated exactly once over the ranks.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ssl_rec.cli.commands import instantiate
from ssl_rec.cli.resume_config import check_resume
from ssl_rec.hardware import MixedPrecisionEmbeddingCollection

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"
CONFIG = ROOT / "configs" / "dist" / "synthetic_int8_row_wise.yaml"


def _small(tmp_path: Path) -> list[str]:
    return ["--config", str(CONFIG), "--trainer.logger", "false",
            "--trainer.default_root_dir", str(tmp_path / "run"),
            "--data.init_args.n_train", "512", "--data.init_args.n_val", "256",
            "--data.init_args.n_test", "256", "--data.init_args.batch_size", "128",
            "--data.init_args.cache_dir", str(tmp_path / "cache")]  # fmt: skip


def _collection(model: torch.nn.Module) -> MixedPrecisionEmbeddingCollection:
    [collection] = [m for m in model.modules() if type(m) is MixedPrecisionEmbeddingCollection]
    return collection


def test_the_command_line_declares_the_tables_of_a_sharded_run_only(tmp_path: Path) -> None:
    pytest.importorskip("torchrec", reason="scale-out needs the optional dist install")
    sharded = instantiate(_small(tmp_path))
    tables = _collection(sharded.model)
    assert tables.declared and all(t.store.is_meta for t in tables.group.tables)
    one = instantiate([*_small(tmp_path), "--trainer.strategy", "auto", "--trainer.devices", "1"])
    assert not _collection(one.model).declared


def test_the_resume_check_reads_a_declared_models_shapes_without_allocating_it(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torchrec", reason="scale-out needs the optional dist install")
    saved = instantiate([*_small(tmp_path), "--trainer.strategy", "auto", "--trainer.devices", "1"])
    checkpoint = {"hyper_parameters": dict(saved.model.hparams),
                  "state_dict": saved.model.state_dict()}  # fmt: skip
    resumed = instantiate(_small(tmp_path)).model
    check_resume(resumed, None, checkpoint, "last.ckpt")
    assert _collection(resumed).declared  # compared by shape: nothing was allocated
    key = next(k for k in checkpoint["state_dict"] if k.endswith("tables.0.store"))
    store = checkpoint["state_dict"][key]
    checkpoint["state_dict"][key] = store[:-1]
    with pytest.raises(ValueError, match=f"model state {key}"):
        check_resume(resumed, None, checkpoint, "last.ckpt")


def _fit_two_processes(run: Callable, tmp_path: Path, log: Path, timeout: float = 400) -> str:
    """A 3-step CLI fit of the shipped row-wise config, Lightning's launcher, 2 processes.

    ``run`` is the ``run_launched`` fixture (tests/distributed/conftest.py).
    """
    args = [*_small(tmp_path), "--trainer.devices", "2", "--trainer.max_steps", "3",
            "--trainer.max_epochs", "1", "--trainer.val_check_interval", "2",
            "--data.init_args.n_train", "1536", "--data.init_args.batch_size", "256"]  # fmt: skip
    command = [sys.executable, str(WORKERS / "cli_tables.py"), "fit", *args]
    done = run(command, timeout, TABLES_LOG=str(log))
    assert done.returncode == 0, f"the 2-process fit failed:\n{done.stdout[-6000:]}"
    return done.stdout


@pytest.mark.slow
def test_a_two_process_cli_fit_allocates_each_tables_rows_once_over_the_ranks(
    tmp_path: Path, run_launched
) -> None:
    pytest.importorskip("torchrec", reason="scale-out needs the optional dist install")
    log = tmp_path / "tables"
    log.mkdir()
    _fit_two_processes(run_launched, tmp_path, log)
    runs = sorted((json.loads(p.read_text()) for p in log.glob("*.json")), key=lambda r: r["rank"])
    assert [r["rank"] for r in runs] == [0, 1]
    declared = [{t["name"]: t for t in r["tables"] if t["declared"]} for r in runs]
    assert declared[0].keys() == declared[1].keys() and len(declared[0]) == 26
    whole = {name: t["rows"] for name, t in declared[0].items()}
    whole_bytes = {name: t["store_bytes"] for name, t in declared[0].items()}
    allocated = [[t for t in r["tables"] if not t["declared"]] for r in runs]
    for name, rows in whole.items():
        held = [sum(t["rows"] for t in ts if t["name"] == name) for ts in allocated]
        assert sum(held) == rows, (name, held, rows)  # every row once, on one rank
    split = [n for n in whole if all(any(t["name"] == n for t in ts) for ts in allocated)]
    assert len(split) >= 3, split  # the large tables were row-split ...
    for ts in allocated:  # ... and no rank ever allocated one of them whole
        assert all(t["rows"] < whole[t["name"]] for t in ts if t["name"] in split)
    total = sum(whole_bytes.values())
    per_rank = [sum(t["store_bytes"] for t in ts) for ts in allocated]
    assert all(b < 0.75 * total for b in per_rank), (per_rank, total)
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt" / "ssl_rec_checkpoint.json").is_file()
