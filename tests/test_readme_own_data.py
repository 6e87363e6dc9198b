"""The README's own-data section runs as written, on a CSV made here."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from ssl_rec.cli import main

ROOT = Path(__file__).resolve().parents[1]


def readme_commands(section: str) -> list[list[str]]:
    """The ``ssl-rec`` commands of the first bash block under the README heading ``section``."""
    text = (ROOT / "README.md").read_text()
    body = text.split(f"## {section}\n", 1)[1]
    block = re.search(r"```bash\n(.*?)```", body, re.S).group(1)
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = [line for line in joined.splitlines() if line.strip().startswith("ssl-rec ")]
    return [shlex.split(line)[1:] for line in lines]


def test_own_data_section_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_clicks
) -> None:
    commands = readme_commands("Your own data")
    assert [c[0] for c in commands] == ["fit", "test", "fit", "fit"]
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    write_clicks(tmp_path / "clicks.csv")
    monkeypatch.chdir(tmp_path)
    # The configs train until validation stops improving (up to 50-100 epochs): capped here.
    quiet = ["--trainer.logger=false", "--trainer.enable_progress_bar=false",
             "--trainer.max_epochs=3"]  # fmt: skip
    for argv in commands:
        main([*argv, *quiet])
    metrics = json.loads((tmp_path / "runs/ctr/tabular/metrics.json").read_text())
    assert metrics["test_auc"] > 0.7
    assert (tmp_path / "runs/finetune/tabular/checkpoints/last.ckpt").is_file()
