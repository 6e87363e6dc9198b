"""Sharded (torch.distributed.checkpoint) checkpoints: nothing unpickled, exact resume, durable
saves, workers that end with their launcher, and single-process commands that read them.

A real 2-rank checkpoint is written once by ``torchrun ... ssl_rec.cli.main fit`` (gloo,
tiny synthetic data); crafted variants replace its ``.metadata`` with a pickle whose
``__reduce__`` runs ``os.system`` (creating a marker file). 2-rank runs are subprocesses
with a timeout, as in ``tests/distributed/test_multiprocess.py``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from cli_outcome import refused

pytest.importorskip("torchrec", reason="scale-out needs the optional dist install (make dist)")

from ssl_rec.cli import main  # noqa: E402
from ssl_rec.distributed import dcp_checkpoint as sharded  # noqa: E402
from ssl_rec.distributed.checkpoint_manifest import (  # noqa: E402
    CHECKPOINT_MANIFEST,
    write_checkpoint_manifest,
)
from ssl_rec.distributed.checkpoint_reader import (  # noqa: E402
    _ALLOWED_GLOBALS,
    read_checkpoint_metadata,
)
from ssl_rec.distributed.dcp_checkpoint import (  # noqa: E402
    CheckpointRefused,
    read_distributed_checkpoint,
    remove_stale_staging,
    save_distributed_checkpoint,
)
from ssl_rec.lightning import CTRModule, load_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WORKERS = ROOT / "tests" / "distributed" / "workers"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
CONFIG = str(ROOT / "configs" / "dist" / "synthetic_int8_row_wise.yaml")


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _fit_args(root: Path, cache: Path, *extra: str) -> list[str]:
    return ["fit", "--config", CONFIG, "--data.init_args.n_train=2048",
            "--data.init_args.n_val=256", "--data.init_args.n_test=256",
            "--data.init_args.batch_size=128", "--data.init_args.synthetic.cardinality_scale=0.001",
            f"--data.init_args.cache_dir={cache}", "--trainer.logger=false",
            "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={root}",
            *extra]  # fmt: skip


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sharded")


@pytest.fixture(scope="module")
def sharded_ckpt(work: Path) -> Path:
    """``checkpoints/last.ckpt`` of a 1-epoch, 2-rank ``ssl-rec fit`` (8 steps per rank)."""
    command = [*TORCHRUN, "-m", "ssl_rec.cli.main",
               *_fit_args(work / "run", work / "cache", "--trainer.max_epochs=1")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, env=_env(),
                          cwd=ROOT)  # fmt: skip
    ckpt = work / "run" / "checkpoints" / "last.ckpt"
    assert (ckpt / CHECKPOINT_MANIFEST).is_file(), done.stderr[-6000:]
    return ckpt


class _Payload:
    """Unpickling this runs ``touch MARKER``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _craft(good: Path, out: Path, manifest: bool = True) -> Path:
    """A copy of ``good`` whose ``.metadata`` is the payload (with a manifest that lists it)."""
    shutil.copytree(good, out)
    (out / ".metadata").write_bytes(pickle.dumps(_Payload(_marker(out))))
    (out / CHECKPOINT_MANIFEST).unlink()
    if manifest:  # an attacker can write the manifest too: it proves nothing about content
        write_checkpoint_manifest(out, 2)
    return out


def _marker(ckpt: Path) -> Path:
    return ckpt.with_suffix(".marker")


@pytest.fixture(scope="module")
def crafted(sharded_ckpt: Path, work: Path) -> Path:
    return _craft(sharded_ckpt, work / "crafted.ckpt")


COMMANDS: dict[str, Callable[[Path, Path], list[str]]] = {
    "test": lambda ckpt, t: ["test", "--ckpt_path", str(ckpt), "--trainer.logger=false",
                             f"--trainer.default_root_dir={t / 'test'}"],
    "predict": lambda ckpt, t: ["predict", "--ckpt_path", str(ckpt), "--trainer.logger=false",
                                f"--trainer.default_root_dir={t / 'predict'}",
                                "--predictions.out", str(t / "p.parquet")],
    "export": lambda ckpt, t: ["export", "--ckpt_path", str(ckpt), "--out", str(t / "export"),
                               "--fields", "[C3]", "--index", "Flat"],
    "quantize": lambda ckpt, t: ["quantize", "--ckpt_path", str(ckpt), "--out", str(t / "q")],
    "evaluate-embeddings": lambda ckpt, t: ["evaluate-embeddings", "--ckpt_path", str(ckpt)],
    "explain": lambda ckpt, t: ["explain", "--ckpt_path", str(ckpt), "--candidate", str(t)],
    "monitor": lambda ckpt, t: ["monitor", "--ckpt_path", str(ckpt), "--candidate", str(t)],
    "fit --ckpt_path": lambda ckpt, t: [
        *_fit_args(t / "resume", t / "cache", "--trainer.max_epochs=2", "--ckpt_path",
                   str(ckpt)), "--trainer.strategy=auto", "--trainer.devices=1"],
    "fit --model.init_from": lambda ckpt, t: [
        *_fit_args(t / "finetune", t / "cache", "--trainer.max_epochs=1",
                   f"--model.init_args.init_from={ckpt}"), "--trainer.strategy=auto",
        "--trainer.devices=1"],
}  # fmt: skip


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_crafted_metadata_is_refused_by_every_command(
    command: str, crafted: Path, tmp_path: Path, capsys
) -> None:
    refused(COMMANDS[command](crafted, tmp_path), capsys, str(crafted / ".metadata"),
             "refused to unpickle")  # fmt: skip
    assert not _marker(crafted).exists()
    assert [p for p in tmp_path.rglob("*") if not p.is_dir()] == []  # nothing written


def test_crafted_metadata_as_a_config_files_ckpt_path_is_refused_before_setup(
    crafted: Path, tmp_path: Path, capsys
) -> None:
    """``ckpt_path: DIR`` in a ``--config`` file is read (and refused) like ``--ckpt_path``,
    before the command sets anything up."""
    config = tmp_path / "ckpt.yaml"
    config.write_text(f"ckpt_path: {crafted}\n")
    argv = ["test", "--config", CONFIG, "--config", str(config), "--trainer.strategy=auto",
            "--trainer.devices=1", "--trainer.logger=false",
            f"--data.init_args.cache_dir={tmp_path / 'cache'}",
            f"--trainer.default_root_dir={tmp_path / 'run'}"]  # fmt: skip
    refused(argv, capsys, str(crafted / ".metadata"), "refused to unpickle")
    assert not _marker(crafted).exists()
    assert [p for p in tmp_path.rglob("*") if p != config and not p.is_dir()] == []


def test_a_directory_without_the_manifest_is_refused_before_its_metadata_is_read(
    sharded_ckpt: Path, tmp_path: Path, capsys
) -> None:
    bare = _craft(sharded_ckpt, tmp_path / "bare.ckpt", manifest=False)
    refused(COMMANDS["test"](bare, tmp_path), capsys, str(bare), CHECKPOINT_MANIFEST)
    with pytest.raises(CheckpointRefused, match="no ssl_rec_checkpoint.json"):
        load_module(bare)
    assert not _marker(bare).exists()


def test_the_payload_is_live(sharded_ckpt: Path, tmp_path: Path) -> None:
    """Control: DCP's own reader runs the crafted file, so the refusals above are what
    keeps the marker away."""
    from torch.distributed.checkpoint import FileSystemReader

    evil = _craft(sharded_ckpt, tmp_path / "evil.ckpt")
    with contextlib.suppress(Exception):  # it fails after running the payload
        FileSystemReader(str(evil)).read_metadata()
    assert _marker(evil).exists()


def test_a_value_that_is_not_plain_data_is_refused(tmp_path: Path) -> None:
    """Non-tensor values are unpickled with torch's weights_only loader, not DCP's pickle."""
    ckpt = tmp_path / "value.ckpt"
    save_distributed_checkpoint({"epoch": 1, "hook": _Payload(_marker(ckpt))}, ckpt)
    with pytest.raises(CheckpointRefused, match="entry hook is not plain data"):
        read_distributed_checkpoint(ckpt)
    assert read_distributed_checkpoint(ckpt, {"epoch"}) == {"epoch": 1}
    assert not _marker(ckpt).exists()


def _refused_metadata(good: Path, out: Path, change: Callable[[object], None], match: str) -> None:
    """Copy ``good`` to ``out`` with ``change`` applied to its metadata (and a manifest that
    lists the new file, as an attacker could write); assert reading it is refused."""
    shutil.copytree(good, out)
    metadata = read_checkpoint_metadata(out)
    change(metadata)
    (out / ".metadata").write_bytes(pickle.dumps(metadata))
    write_checkpoint_manifest(out, 2)
    with pytest.raises(CheckpointRefused, match=match):
        read_distributed_checkpoint(out)


def test_metadata_naming_a_file_outside_the_directory_is_refused(
    sharded_ckpt: Path, tmp_path: Path
) -> None:
    def outside(metadata) -> None:
        next(iter(metadata.storage_data.values())).relative_path = "../../etc/passwd"

    _refused_metadata(sharded_ckpt, tmp_path / "outside.ckpt", outside, "outside its directory")


def test_metadata_declaring_huge_tensors_is_refused(sharded_ckpt: Path, tmp_path: Path) -> None:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    def huge(metadata) -> None:
        entry = next(m for m in metadata.state_dict_metadata.values()
                     if isinstance(m, TensorStorageMetadata))  # fmt: skip
        entry.size = torch.Size([1 << 20, 1 << 20])

    _refused_metadata(sharded_ckpt, tmp_path / "huge.ckpt", huge,
                      "more tensor bytes than its files hold")  # fmt: skip


def test_a_changed_file_is_refused_naming_it(sharded_ckpt: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "changed.ckpt"
    shutil.copytree(sharded_ckpt, ckpt)
    data = ckpt / "__1_0.distcp"
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size - 1)
    with pytest.raises(CheckpointRefused, match=r"__1_0\.distcp: .* bytes"):
        read_distributed_checkpoint(ckpt)
    raw = bytearray((ckpt / "__0_0.distcp").read_bytes())
    raw[len(raw) // 2] ^= 1
    (ckpt / "__0_0.distcp").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"__0_0\.distcp: corrupt"):
        read_distributed_checkpoint(ckpt)


def test_the_private_torch_names_the_reader_admits_still_exist() -> None:
    """Pins ``_StorageInfo``, ``_MEM_FORMAT_ENCODING`` and ``_get_layout`` (private to torch)."""
    for module, names in _ALLOWED_GLOBALS.items():
        if module == "pathlib._local" and sys.version_info < (3, 13):
            continue
        for name in names:
            assert hasattr(importlib.import_module(module), name), f"{module}.{name}"


@pytest.mark.parametrize("command", ["test", "predict", "export", "fit --ckpt_path"])
def test_single_process_commands_accept_the_sharded_checkpoint(
    command: str, sharded_ckpt: Path, tmp_path: Path
) -> None:
    ckpt = sharded_ckpt
    if command == "fit --ckpt_path":  # resumes in place: work on a copy of the run
        shutil.copytree(sharded_ckpt.parents[1], tmp_path / "resume")
        ckpt = tmp_path / "resume" / "checkpoints" / "last.ckpt"
    main(COMMANDS[command](ckpt, tmp_path))
    if command == "test":
        assert 0.5 < json.loads((tmp_path / "test" / "metrics.json").read_text())["test_auc"]
    elif command == "predict":
        import pyarrow.parquet as pq

        assert pq.read_table(tmp_path / "p.parquet").num_rows == 256
    elif command == "export":
        manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
        assert manifest["source_checkpoint"]["path"] == "last.ckpt"
        assert len(manifest["source_checkpoint"]["sha256"]) == 64
    else:  # the single-process save replaced the directory by a file, in one swap
        assert ckpt.is_file() and torch.load(ckpt, weights_only=True)["epoch"] == 1


def test_load_from_checkpoint_reads_a_sharded_directory(sharded_ckpt: Path, crafted: Path):
    """``CTRModule.load_from_checkpoint(DIR)`` gives ``load_module(DIR)``'s weights; the
    crafted directory is refused before anything is unpickled."""
    loaded, reference = CTRModule.load_from_checkpoint(sharded_ckpt), load_module(sharded_ckpt)
    assert type(loaded) is CTRModule
    state, expected = loaded.state_dict(), reference.state_dict()
    assert state.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(state[key], value), key
    with pytest.raises(CheckpointRefused, match="refused to unpickle"):
        CTRModule.load_from_checkpoint(crafted)
    assert not _marker(crafted).exists()


def test_resuming_the_sharded_checkpoint_with_another_shape_is_refused(
    sharded_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fit --ckpt_path DIR`` and ``--ckpt_path last`` (a directory) compare the command's
    config with the directory's hyperparameters, as for a file: one line, nothing written."""
    shutil.copytree(sharded_ckpt.parents[1], tmp_path / "resume")
    ckpt = tmp_path / "resume" / "checkpoints" / "last.ckpt"
    before = sorted((p.name, p.stat().st_mtime_ns) for p in ckpt.parent.rglob("*"))
    dim = "--model.init_args.backbone.init_args.embedding_dim=8"
    for given in (str(ckpt), "last"):
        argv = [*_fit_args(tmp_path / "resume", tmp_path / "cache", "--trainer.max_epochs=2",
                           "--ckpt_path", given, dim),
                "--trainer.strategy=auto", "--trainer.devices=1"]  # fmt: skip
        refused(argv, capsys, f"cannot resume {ckpt} with",
                 "model.init_args.backbone.init_args.embedding_dim 8 (checkpoint: 16)")  # fmt: skip
    assert sorted((p.name, p.stat().st_mtime_ns) for p in ckpt.parent.rglob("*")) == before


def _losses_match(resumed: list, full: list) -> None:
    expected = dict(map(tuple, full))
    assert resumed and all(step in expected for step, _ in resumed)
    losses = [loss for _, loss in resumed]
    torch.testing.assert_close(losses, [expected[step] for step, _ in resumed], rtol=0, atol=1e-6)


def test_two_rank_resume_is_exact_and_a_failed_save_keeps_the_previous_one(
    tmp_path: Path,
) -> None:
    """Step checkpoint and ``last``: the same losses as the uninterrupted run; saving after
    the restore works (and first removes a killed save's staging directory); a save whose
    rank-1 writes fail leaves ``last.ckpt`` as it was and no directory under a new name."""
    command = [*TORCHRUN, str(WORKERS / "lifecycle.py"), str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, env=_env(),
                          cwd=WORKERS)  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    result = json.loads(lines[0][len("RESULT ") :])
    assert [s for s, _ in result["full"]] == list(range(1, 13))
    _losses_match(result["first"], result["full"])
    assert [s for s, _ in result["from_step"]] == list(range(5, 13))
    _losses_match(result["from_step"], result["full"])
    assert [s for s, _ in result["from_last"]] == list(range(9, 13))
    _losses_match(result["from_last"], result["full"])
    resumed = tmp_path / "resumed"
    assert {p.name for p in resumed.iterdir()} == {"step10.ckpt", "step12.ckpt", "last.ckpt"}
    assert read_distributed_checkpoint(resumed / "last.ckpt", {"global_step"}) == {
        "global_step": 12
    }
    for key in ("over_last", "new_name"):  # rank 1's error, on rank 0, with its errno
        assert result[key] and "OSError: [Errno 28]" in result[key], result[key]
    ckpt = tmp_path / "ckpt"
    assert sorted(p.name for p in ckpt.iterdir()) == ["last.ckpt", "step4.ckpt", "step8.ckpt"]
    assert read_distributed_checkpoint(ckpt / "last.ckpt")["global_step"] == 8


KILLED_SAVE = """
import sys, time
from pathlib import Path
import torch
from torch.distributed.checkpoint import FileSystemWriter
from ssl_rec.distributed.dcp_checkpoint import save_distributed_checkpoint

path = Path(sys.argv[1])
save_distributed_checkpoint({"epoch": 1, "w": torch.ones(3)}, path)
def finish(self, metadata, results):  # the data files are written; the metadata is next
    print("SAVING", flush=True)
    time.sleep(600)
FileSystemWriter.finish = finish
save_distributed_checkpoint({"epoch": 2, "w": torch.zeros(3)}, path)
"""


def test_a_kill_during_a_save_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "last.ckpt"
    process = subprocess.Popen([sys.executable, "-c", KILLED_SAVE, str(ckpt)],
                               stdout=subprocess.PIPE, text=True, env=_env())  # fmt: skip
    try:
        assert process.stdout.readline().strip() == "SAVING"
    finally:
        process.kill()
        process.wait()
    previous = read_distributed_checkpoint(ckpt)
    assert previous["epoch"] == 1 and torch.equal(previous["w"], torch.ones(3))
    assert (tmp_path / ".last.ckpt.partial").is_dir()  # what the killed save had written
    save_distributed_checkpoint({"epoch": 3}, ckpt)
    assert read_distributed_checkpoint(ckpt) == {"epoch": 3}
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_staging_left_by_killed_saves_is_removed_and_nothing_else(tmp_path: Path) -> None:
    for name in (".step4.ckpt.partial", ".last.ckpt.old", "last.ckpt", ".keep.partial"):
        (tmp_path / name).mkdir()
    removed = remove_stale_staging(tmp_path)
    assert sorted(p.name for p in removed) == [".last.ckpt.old", ".step4.ckpt.partial"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".keep.partial", "last.ckpt"]


def test_the_swap_without_renameat2_replaces_the_checkpoint(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sharded, "_rename_exchange", lambda a, b: False)
    ckpt = tmp_path / "last.ckpt"
    save_distributed_checkpoint({"epoch": 1}, ckpt)
    save_distributed_checkpoint({"epoch": 2}, ckpt)
    assert read_distributed_checkpoint(ckpt) == {"epoch": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for whichever process reaps it)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /proc: Linux")
def test_sigkill_of_torchrun_ends_both_workers_within_10_s(tmp_path: Path) -> None:
    root = tmp_path / "run"
    command = [*TORCHRUN, "-m", "ssl_rec.cli.main",
               *_fit_args(root, tmp_path / "cache", "--trainer.max_epochs=1000")]  # fmt: skip
    launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=_env(), cwd=ROOT)  # fmt: skip
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while not (root / "checkpoints" / "last.ckpt").exists():  # training, saving epochs
            assert launcher.poll() is None and time.monotonic() < deadline, "fit did not start"
            time.sleep(0.5)
        workers = _children(launcher.pid)
        assert len(workers) == 2
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        killed = time.monotonic()
        while any(_running(w) for w in workers) and time.monotonic() - killed < 30:
            time.sleep(0.2)
        ended = time.monotonic() - killed
        assert ended <= 10, f"workers ran {ended:.1f} s after the launcher died"
    finally:
        for pid in [launcher.pid, *workers]:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
    # Whenever the kill struck, last.ckpt is a whole checkpoint.
    assert read_distributed_checkpoint(root / "checkpoints" / "last.ckpt", {"epoch"})["epoch"] >= 0
