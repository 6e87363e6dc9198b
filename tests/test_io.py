import json
import os
import stat

import pytest

from ssl_rec._io import atomic_directory, atomic_write_json, remove_stale_temporaries


def test_atomic_json_has_normal_permissions_and_content(tmp_path):
    path = atomic_write_json(tmp_path / "a" / "m.json", {"x": 1})
    assert json.loads(path.read_text()) == {"x": 1}
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask


def test_atomic_directory_appears_only_on_success(tmp_path):
    target = tmp_path / "export"
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as tmp:
            (tmp / "part.npy").write_bytes(b"123")
            raise RuntimeError("interrupted")
    assert not target.exists()
    assert not [p for p in tmp_path.iterdir()]  # the temporary directory is gone too
    with atomic_directory(target) as tmp:
        (tmp / "done").write_text("ok")
    assert (target / "done").read_text() == "ok"
    with pytest.raises(FileExistsError):
        with atomic_directory(target):
            pass
    with atomic_directory(target, overwrite=True) as tmp:
        (tmp / "new").write_text("v2")
    assert sorted(p.name for p in target.iterdir()) == ["new"]


def test_temporaries_of_dead_processes_are_removed_and_live_ones_kept(tmp_path):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    final = tmp_path / "cache-entry"
    left = tmp_path / f".cache-entry.{dead}.abc123.tmp"
    (left / "train").mkdir(parents=True)
    live = tmp_path / f".cache-entry.{os.getpid()}.def456.tmp"
    live.mkdir()
    other = tmp_path / f".another.{dead}.x.tmp"
    other.mkdir()
    assert remove_stale_temporaries(final) == [left]
    assert not left.exists() and live.is_dir() and other.is_dir()
