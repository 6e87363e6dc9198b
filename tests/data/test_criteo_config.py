"""The shipped Criteo config trains on small real-looking files: one file, day files, gzip."""

import os
from pathlib import Path

import pytest
from criteo_lines import HEX, criteo_line, write_lines

from ssl_rec.cli import main
from ssl_rec.data import write_criteo_tsv

# The real rows live in a ``shared/data`` folder beside the project checkout, never in its
# fixtures; SSL_REC_CRITEO_SAMPLE points elsewhere. Without them the test skips.
_BESIDE = Path(__file__).resolve().parents[3] / "shared" / "data" / "criteo_sample" / "train.txt"
REAL_SAMPLE = Path(os.environ.get("SSL_REC_CRITEO_SAMPLE", str(_BESIDE)))


def _fit(tmp_path, data_path):
    root = tmp_path / "run"
    main([
        "fit", "--config", "configs/ctr/criteo.yaml", "--data.path", str(data_path),
        "--data.cache_dir", str(tmp_path / "cache"), "--data.batch_size", "64",
        "--trainer.default_root_dir", str(root), "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.max_steps", "2",
    ])  # fmt: skip
    return root


def _rare_lines(n=200):
    # Like the real sample: with min_frequency 4 every value of C7 is rare, C1 is not.
    return [
        criteo_line(
            "1" if i % 4 == 0 else "0", cats=[HEX] * 6 + [f"{i:08x}"] + [f"{i % 3:08x}"] * 19
        )
        for i in range(n)
    ]


def test_config_trains_on_200_rows_with_all_rare_fields(tmp_path):
    path = write_lines(tmp_path / "train.txt", _rare_lines())
    root = _fit(tmp_path, path)
    assert (root / "checkpoints" / "last.ckpt").is_file()


def test_config_trains_on_gzip_day_files(tmp_path, small_rows):
    for d in range(3):
        write_criteo_tsv(tmp_path / "days" / f"day_{d}.gz", small_rows)
    root = _fit(tmp_path, tmp_path / "days")
    assert (root / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.skipif(
    not REAL_SAMPLE.is_file(), reason="the real Criteo sample is not on this machine"
)
def test_config_trains_on_the_real_sample(tmp_path):
    root = _fit(tmp_path, REAL_SAMPLE)
    assert (root / "checkpoints" / "last.ckpt").is_file()
