"""Durable checkpoint writes: kills, a full disk and flipped bits never leave a checkpoint that
loads wrong; ``save_top_k`` holds across kills; temporaries of killed writers are cleaned."""

from __future__ import annotations

import errno
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from cli_outcome import error_line
from tiny_ctr_config import write_tiny_ctr_config

from ssl_rec._io import ChecksumError
from ssl_rec.cli import main
from ssl_rec.lightning.checkpoint_checksums import CHECKSUMS_KEY, verify_checksums
from ssl_rec.lightning.checkpoint_loading import read_checkpoint
from ssl_rec.lightning.durable_checkpoint_io import (
    DurableCheckpointIO,
    remove_stale_checkpoint_temporaries,
)

ROOT = Path(__file__).resolve().parents[2]
SSL_REC = Path(sys.executable).with_name("ssl-rec")
TEMPORARY = ".tmp"


def _step_callback(directory: Path, version_counter: bool | None = None) -> Path:
    """The shipped ``last.yaml`` callback, saving ``step{N}.ckpt`` at every training step."""
    callback = yaml.safe_load((ROOT / "configs/common/callbacks/last.yaml").read_text())
    callback["init_args"].update(every_n_train_steps=1, filename="step{step}")
    if version_counter is not None:
        callback["init_args"]["enable_version_counter"] = version_counter
    path = directory / "step_callback.yaml"
    path.write_text(yaml.safe_dump(callback))
    return path


def _config(directory: Path, cache: Path, **callback: bool) -> Path:
    """A tiny CTR fit (64-row batches, no validation) checkpointing every step."""
    trainer = {"limit_val_batches": 0, "callbacks": [str(_step_callback(directory, **callback))]}
    data = {"n_train": 1024, "n_val": 128, "n_test": 128, "batch_size": 64,
            "cache_dir": str(cache)}  # fmt: skip
    return write_tiny_ctr_config(directory, trainer, data)


def _fit(config: Path, root: Path, max_steps: int, *extra: str) -> list[str]:
    return ["fit", "--config", str(config), f"--trainer.default_root_dir={root}",
            f"--trainer.max_steps={max_steps}", *extra]  # fmt: skip


def _files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _temporaries(directory: Path) -> list[str]:
    return [name for name in _files(directory) if name.endswith(TEMPORARY)]


@pytest.fixture
def other_filesystem(tmp_path: Path) -> Iterator[Path | None]:
    """A directory on another filesystem than ``tmp_path``: under ``/dev/shm``, else a tmpfs
    mounted for the test (root only); ``None`` when neither is possible."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shm.stat().st_dev != tmp_path.stat().st_dev:
        directory = Path(tempfile.mkdtemp(prefix="ssl_rec_durable_", dir=shm))
        try:
            yield directory
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        return
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(mount)],
                          capture_output=True, check=False)  # fmt: skip
    if done.returncode != 0:
        yield None
        return
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True, check=False)


@pytest.fixture(params=["same_filesystem", "other_filesystem"])
def staging_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """``$TMPDIR`` for the writers: beside the checkpoints, or on another filesystem."""
    if request.param == "same_filesystem":
        directory = tmp_path / "tmpdir"
        directory.mkdir()
        return directory
    directory = request.getfixturevalue("other_filesystem")
    if directory is None:
        pytest.skip("no other filesystem: /dev/shm is absent and mount -t tmpfs is not allowed")
    return directory


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint directory of a finished 4-step fit (``last.ckpt``, ``step4.ckpt``)."""
    base = tmp_path_factory.mktemp("fitted")
    main(_fit(_config(base, base / "cache"), base / "run", 4))
    return base / "run" / "checkpoints"


# --- checkpoints are written in their directory, atomically --------------------------------


def _save_forever(directory: str, staging: str) -> None:
    os.environ["TMPDIR"] = staging
    tempfile.tempdir = None
    torch.set_num_threads(1)
    io, path = DurableCheckpointIO(), Path(directory) / "last.ckpt"
    first = io.load_checkpoint(path)["global_step"] + 1 if path.exists() else 0  # resume
    for step in range(first, 10**9):
        weights = torch.full((1 << 20,), float(step))  # 4 MB
        io.save_checkpoint({"global_step": step, "state_dict": {"w": weights}}, path)


def test_killed_writer_leaves_the_previous_checkpoint_and_no_staging_file(
    tmp_path: Path, staging_dir: Path
) -> None:
    """SIGKILL a process that does nothing but save, at random moments and mid-write."""
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    rng = random.Random(0)
    context = multiprocessing.get_context("fork")
    last_step, mid_write = -1, 0
    for kill in range(16):
        writer = context.Process(target=_save_forever, args=(str(directory), str(staging_dir)))
        writer.start()
        deadline = time.monotonic() + 10
        while not (directory / "last.ckpt").exists() and time.monotonic() < deadline:
            time.sleep(0.001)
        if kill % 2:  # the moment a temporary appears, i.e. during a write
            while not _temporaries(directory) and time.monotonic() < deadline:
                time.sleep(0.0002)
        else:
            time.sleep(rng.uniform(0.0, 0.2))
        os.kill(writer.pid, signal.SIGKILL)
        writer.join()
        mid_write += bool(_temporaries(directory))
        checkpoint = read_checkpoint(directory / "last.ckpt")  # loads, checksums verified
        step = checkpoint["global_step"]
        assert torch.equal(checkpoint["state_dict"]["w"], torch.full((1 << 20,), float(step)))
        assert step >= last_step
        last_step = step
    assert mid_write > 0, "no kill landed during a write"
    assert list(staging_dir.rglob("*")) == []  # nothing was ever staged under $TMPDIR
    left = _temporaries(directory)
    removed = remove_stale_checkpoint_temporaries(directory)  # what a fit does first
    assert sorted(p.name for p in removed) == left
    assert _files(directory) == ["last.ckpt"]


def test_killed_fits_resume_from_last_and_keep_one_step_file(
    tmp_path: Path, other_filesystem: Path | None
) -> None:
    """``ssl-rec fit`` saving every step, killed twice (once mid-write), resumed each time.

    ``$TMPDIR`` is on another filesystem than the checkpoints when one is at hand (there
    Lightning's own writer stages and then copies into the final name).
    """
    staging = other_filesystem or tmp_path / "tmpdir"  # same filesystem as a fallback
    staging.mkdir(exist_ok=True)
    config, root = _config(tmp_path, tmp_path / "cache"), tmp_path / "run"
    directory = root / "checkpoints"
    env = {**os.environ, "TMPDIR": str(staging)}
    rng, last_step = random.Random(1), 0
    for kill in range(3):
        resume = ["--ckpt_path", "last"] if kill else []
        command = [str(SSL_REC), *_fit(config, root, 20, *resume)]
        fit = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)  # fmt: skip
        if kill == 2:  # the last run finishes
            out, _ = fit.communicate(timeout=300)
            assert fit.returncode == 0, out[-3000:]
            assert f"Restoring states from the checkpoint path at {directory / 'last.ckpt'}" in out
            break
        before = (directory / "last.ckpt").stat().st_mtime_ns if kill else None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and fit.poll() is None:  # this run saved once
            last = directory / "last.ckpt"
            if last.exists() and last.stat().st_mtime_ns != before:
                break
            time.sleep(0.002)
        if kill == 1:
            while time.monotonic() < deadline and not _temporaries(directory):
                time.sleep(0.0002)
        else:
            time.sleep(rng.uniform(0.0, 0.5))
        fit.send_signal(signal.SIGKILL)
        out, _ = fit.communicate()
        assert fit.returncode == -signal.SIGKILL, out[-3000:]
        checkpoint = torch.load(directory / "last.ckpt", map_location="cpu", weights_only=True)
        assert verify_checksums(checkpoint, "last.ckpt")
        assert last_step < checkpoint["global_step"] < 20  # this run resumed and saved
        last_step = checkpoint["global_step"]
    assert torch.load(directory / "last.ckpt", weights_only=True)["global_step"] == 20
    assert _files(directory) == ["last.ckpt", "step20.ckpt"]  # save_top_k: 1, no temporaries
    assert [p for p in staging.rglob("*") if p.is_file()] == []  # nothing staged in $TMPDIR


def test_resume_overwrites_the_step_file_a_killed_fit_wrote_after_last(
    tmp_path: Path, recwarn: pytest.WarningsRecorder
) -> None:
    """A kill between ``step{N+1}.ckpt`` and ``last.ckpt`` leaves a file the resumed callback
    does not know; without Lightning's version counter (shipped configs) the resumed run
    rewrites that name and save_top_k removes it later, instead of leaving it for ever.
    The resume does not warn that its own checkpoint directory is not empty."""
    config, root = _config(tmp_path, tmp_path / "cache"), tmp_path / "run"
    directory = root / "checkpoints"
    main(_fit(config, root, 3))
    assert _files(directory) == ["last.ckpt", "step3.ckpt"]
    shutil.copy(directory / "step3.ckpt", directory / "step4.ckpt")  # the killed run's
    recwarn.clear()
    main(_fit(config, root, 5, "--ckpt_path", "last"))
    assert _files(directory) == ["last.ckpt", "step5.ckpt"]
    assert not [w for w in recwarn if "exists and is not empty" in str(w.message)]


def test_stale_temporaries_of_dead_writers_only_are_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    live = os.getppid()
    names = [
        f".last.ckpt.{dead.pid}.ab12cd.tmp",
        f".step3.ckpt.{dead.pid}.x_y9.tmp",
        f".last.ckpt.{live}.ab12cd.tmp",  # its writer still runs
        f".metrics.json.{dead.pid}.q.tmp",  # not a checkpoint's
        "notes.txt",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    removed = remove_stale_checkpoint_temporaries(tmp_path)
    assert sorted(p.name for p in removed) == sorted(names[:2])
    assert _files(tmp_path) == sorted(names[2:])


# --- a failed save ------------------------------------------------------------------------


def test_disk_full_during_a_save_is_one_line_and_keeps_the_previous_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config, root = _config(tmp_path, tmp_path / "cache"), tmp_path / "run"
    directory = root / "checkpoints"
    real_fsync = os.fsync

    def fsync(fd: int) -> None:  # the disk fills while step3.ckpt is written
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(".step3.ckpt."):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(SystemExit) as exit_info:
        main(_fit(config, root, 4))
    assert exit_info.value.code == 2
    line = error_line(capsys.readouterr().err)
    assert f"cannot save checkpoint to {directory}: no space left on device (needs " in line
    assert " MB" in line
    assert _files(directory) == ["last.ckpt", "step2.ckpt"]  # no step3.ckpt, no temporary
    for name in ("last.ckpt", "step2.ckpt"):
        assert read_checkpoint(directory / name)["global_step"] == 2


# --- checksums ----------------------------------------------------------------------------


def _flip_tensor_byte(source: Path, target: Path) -> None:
    """Copy ``source`` with one byte flipped inside its largest tensor's data record."""
    with zipfile.ZipFile(source) as archive:
        info = max((i for i in archive.infolist() if "/data/" in i.filename),
                   key=lambda i: i.file_size)  # fmt: skip
        assert info.compress_type == zipfile.ZIP_STORED
    data = bytearray(source.read_bytes())
    header = info.header_offset  # local file header: 30 bytes, then the name and extra field
    name_length = int.from_bytes(data[header + 26 : header + 28], "little")
    extra_length = int.from_bytes(data[header + 28 : header + 30], "little")
    start = header + 30 + name_length + extra_length
    data[start + info.file_size // 2] ^= 0x40
    target.write_bytes(bytes(data))


def test_flipped_byte_in_a_tensor_is_reported_naming_file_and_tensor(
    fitted: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.ckpt"
    _flip_tensor_byte(fitted / "last.ckpt", bad)
    torch.load(bad, weights_only=True)  # torch itself does not notice
    with pytest.raises(ChecksumError) as error:
        read_checkpoint(bad)
    message = str(error.value)
    assert message.startswith(f"{bad}: corrupt checkpoint: tensor state_dict/backbone.")
    assert "SSL_REC_VERIFY=0" in message and "\n" not in message


def test_corrupt_checkpoint_at_the_command_line_is_one_line_exit_2(
    fitted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.ckpt"
    _flip_tensor_byte(fitted / "last.ckpt", bad)
    with pytest.raises(SystemExit) as exit_info:
        main(["test", "--ckpt_path", str(bad), "--trainer.logger=false"])
    assert exit_info.value.code == 2
    assert f"{bad}: corrupt checkpoint: tensor " in error_line(capsys.readouterr().err)


def test_resume_from_a_corrupt_last_checkpoint_is_refused(
    fitted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fit --ckpt_path last``: Lightning loads it through DurableCheckpointIO, which verifies."""
    root = tmp_path / "run"
    (root / "checkpoints").mkdir(parents=True)
    _flip_tensor_byte(fitted / "last.ckpt", root / "checkpoints" / "last.ckpt")
    config = _config(tmp_path, fitted.parent.parent / "cache")
    with pytest.raises(SystemExit) as exit_info:
        main(_fit(config, root, 6, "--ckpt_path", "last"))
    assert exit_info.value.code == 2
    line = error_line(capsys.readouterr().err)
    assert f"{root / 'checkpoints' / 'last.ckpt'}: corrupt checkpoint: tensor " in line


def test_verification_can_be_switched_off(
    fitted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "bad.ckpt"
    _flip_tensor_byte(fitted / "last.ckpt", bad)
    monkeypatch.setenv("SSL_REC_VERIFY", "0")
    assert read_checkpoint(bad)["global_step"] == 4


def test_checkpoint_without_checksums_still_loads(fitted: Path, tmp_path: Path) -> None:
    checkpoint = torch.load(fitted / "step4.ckpt", weights_only=True)
    state = checkpoint["state_dict"]
    tables = [name for name in state if name.endswith(".store")]
    assert tables  # the embedding tables' stores are among the checksummed tensors
    recorded = set(checkpoint[CHECKSUMS_KEY]["tensors"])
    assert recorded >= {f"state_dict/{k}" for k, v in state.items() if torch.is_tensor(v)}
    del checkpoint[CHECKSUMS_KEY]
    torch.save(checkpoint, tmp_path / "old.ckpt")
    assert read_checkpoint(tmp_path / "old.ckpt")["global_step"] == 4
