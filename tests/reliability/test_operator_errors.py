"""Operator errors (full disk, truncated cache shard, existing output, stray temp dirs): one line,
exit status 2, no retry."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_outcome import SYNTHETIC_SIZES, error_line, exit_code, synthetic_fit

from ssl_rec._io import DiskFullError, atomic_directory
from ssl_rec.cli import main
from ssl_rec.cli.errors import disk_full_names, guarded
from ssl_rec.data import SyntheticCTRDataModule, storage


@contextlib.contextmanager
def _tmpfs(directory: Path, size: int | str) -> Iterator[Path]:
    """``directory``, created, with a tmpfs of ``size`` bytes (or ``"64k"``) mounted on it.

    Unmounted on exit; the test is skipped where mounting is not allowed (root only).
    """
    directory.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                           capture_output=True, text=True)  # fmt: skip
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], check=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, Path]:
    """``(cache_dir, last.ckpt)`` of a one-step CTR fit."""
    base = tmp_path_factory.mktemp("operator")
    main(synthetic_fit(base / "cache", base / "run", "--trainer.max_steps=1"))
    return base / "cache", base / "run" / "checkpoints" / "last.ckpt"


FAILURES = {
    "disk full": (OSError(errno.ENOSPC, "No space left on device"), "no space left on device"),
    "bad data": (ValueError("row 3: label must be 0 or 1"), "row 3: label must be 0 or 1"),
}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_a_failing_preprocessing_is_attempted_once_and_reported_in_one_line(
    tmp_path, monkeypatch, capsys, case
) -> None:
    error, expected = FAILURES[case]
    attempts = []

    def failing_write(self, batch) -> None:
        attempts.append(self.directory)
        raise error

    monkeypatch.setattr(storage.ShardWriter, "write", failing_write)
    cache = tmp_path / "cache"
    assert exit_code(synthetic_fit(cache, tmp_path / "run")) == 2
    line = error_line(capsys.readouterr().err)
    assert expected in line, line
    assert len(attempts) == 1, attempts  # no retry (LightningDataModule.__str__ rebuilt it)
    if case == "disk full":
        assert f"writing {cache}/synthetic-" in line, line
    # the interrupted build left no partial entry a later run would trust
    assert not [p for p in cache.iterdir() if not p.name.endswith(".lock")]


def test_a_full_disk_met_during_a_run_names_the_run_directory(tmp_path, capsys) -> None:
    """A writer's own exception raised from ENOSPC (torch.save's RuntimeError) is one line too."""

    def save_checkpoint(argv: list[str]) -> None:
        with disk_full_names(tmp_path / "run"):
            try:
                raise OSError(errno.ENOSPC, "No space left on device")
            except OSError as e:
                raise RuntimeError("PytorchStreamWriter failed writing file data/0") from e

    with pytest.raises(SystemExit) as exit_info:
        guarded(save_checkpoint, [])
    assert exit_info.value.code == 2
    line = error_line(capsys.readouterr().err)
    assert f"no space left on device writing {tmp_path / 'run'}" in line, line


def test_a_full_disk_inside_an_artifact_directory_names_the_directory(tmp_path) -> None:
    final = tmp_path / "export"
    with pytest.raises(DiskFullError) as info, atomic_directory(final) as tmp:
        (tmp / "vectors.npy").write_bytes(b"x" * 4096)
        raise OSError(errno.ENOSPC, "No space left on device")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(final)
    assert str(info.value.strerror).startswith(f"no space left on device writing {final} ")
    assert "needs more than" in str(info.value.strerror)
    assert list(tmp_path.iterdir()) == []  # the temporary directory is gone


def test_a_real_full_disk_while_preprocessing_is_one_line(tmp_path, capsys) -> None:
    """On a 256 KiB tmpfs (root only; skipped where mounting is not allowed)."""
    with _tmpfs(tmp_path / "small", "256k") as small:
        assert exit_code(synthetic_fit(small / "cache", tmp_path / "run")) == 2
        line = error_line(capsys.readouterr().err)
        assert f"no space left on device writing {small / 'cache'}/synthetic-" in line, line


def test_a_real_full_disk_while_saving_a_quantized_model_names_it(checkpoint, tmp_path) -> None:
    """``torch.save`` to a path on a full disk raises a RuntimeError that says nothing of
    space; the quantized directory's ``model.pt`` is written as bytes, so it is a
    ``DiskFullError``, and no directory is left. The tmpfs holds the files written before
    ``model.pt`` and half of it, so the disk fills inside ``model.pt``."""
    from ssl_rec.lightning.ctr_checkpoint import load_ctr
    from ssl_rec.quantize import ModelBuilder, save_quantized

    _, ckpt = checkpoint
    _, source = load_ctr(str(ckpt))
    model = ModelBuilder(source).build(source.fp32_plan())
    probe = save_quantized(model, tmp_path / "probe", {})
    before = sum(f.stat().st_size for f in probe.iterdir() if f.name != "manifest.json")
    size = before - (probe / "model.pt").stat().st_size // 2 + 64 * 1024  # + directory pages
    with _tmpfs(tmp_path / "small", size) as small:
        with pytest.raises(DiskFullError) as info:
            save_quantized(model, small / "q", {})
        assert info.value.errno == errno.ENOSPC
        assert str(info.value.strerror).startswith("no space left on device writing "), info.value
        assert "model.pt" in str(info.value.__cause__), repr(info.value.__cause__)
        assert list(small.iterdir()) == []


def test_a_full_disk_while_writing_a_faiss_index_is_a_disk_full_error(tmp_path) -> None:
    """FAISS reports a failed write as a RuntimeError; an export's index writer turns a full
    device into ``ENOSPC``, which the export's directory names (a 64 KiB tmpfs)."""
    import faiss
    import numpy as np

    from ssl_rec.evaluation.faiss_index import write_faiss_index

    index = faiss.IndexFlatL2(64)
    index.add(np.random.default_rng(0).random((2000, 64), dtype=np.float32))  # 512 KB
    with pytest.raises(RuntimeError, match="No such file"):  # other failures stay themselves
        write_faiss_index(index, tmp_path / "absent" / "x.faiss")
    with _tmpfs(tmp_path / "small", "64k") as small:
        with pytest.raises(DiskFullError) as info, atomic_directory(small / "export") as tmp:
            write_faiss_index(index, tmp / "C1.faiss")
        assert info.value.errno == errno.ENOSPC and info.value.filename == str(small / "export")
        assert isinstance(info.value.__cause__, OSError)
        assert info.value.__cause__.filename.endswith("C1.faiss")
        assert list(small.iterdir()) == []


def test_a_truncated_cache_shard_names_the_file_and_how_to_rebuild(
    checkpoint, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("SSL_REC_VERIFY", "0")  # the open fails, not a checksum (test_integrity)
    cache, _ = checkpoint
    entry = SyntheticCTRDataModule(**SYNTHETIC_SIZES, cache_dir=str(cache)).data_dir
    shard = entry / "train" / "00000.arrow"
    original = shard.read_bytes()
    try:
        shard.write_bytes(original[: len(original) // 2])
        assert exit_code(synthetic_fit(cache, tmp_path / "run")) == 2
        line = error_line(capsys.readouterr().err)
        assert f"{shard}: unreadable preprocessed shard" in line, line
        assert f"delete {entry} to rebuild it" in line, line
    finally:
        shard.write_bytes(original)


@pytest.mark.parametrize("command", ["export", "quantize"])
def test_an_existing_output_is_refused_with_the_command_line_flag(
    checkpoint, tmp_path, capsys, command
) -> None:
    _, ckpt = checkpoint
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert exit_code([command, "--ckpt_path", str(ckpt), "--out", str(out)]) == 2
    line = error_line(capsys.readouterr().err)
    assert f"{out} already exists; pass --overwrite true to replace it" in line, line
    assert (out / "keep.txt").read_text() == "mine"


def test_the_python_api_keeps_its_own_spelling(tmp_path) -> None:
    with pytest.raises(FileExistsError, match="pass overwrite=True"), atomic_directory(tmp_path):
        pass


def test_no_wandb_temp_dirs_are_left_in_tmpdir(checkpoint, tmp_path) -> None:
    """Even by a process that dies without running its exit handlers (killed, os._exit)."""
    cache, _ = checkpoint
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    argv = synthetic_fit(cache, tmp_path / "run", "--trainer.max_steps=1")
    code = ("import os, sys; from ssl_rec.cli import main; main(sys.argv[1:]); "
            "print('wandb' in sys.modules, flush=True); os._exit(0)")  # fmt: skip
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                         env=env, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"  # wandb was never imported
    assert [p.name for p in tmpdir.iterdir() if "wandb" in p.name] == []
