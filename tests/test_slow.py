"""Long runs behind ``--runslow`` (``make test-all``): the headline claims at full size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ssl_rec.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_dlrm_on_default_synthetic_data_reaches_the_oracle(tmp_path: Path) -> None:
    """``configs/ctr/synthetic.yaml`` as shipped (1M rows, 2 epochs): within 0.01 of the oracle."""
    config = str(ROOT / "configs/ctr/synthetic.yaml")
    common = ["--config", config, f"--trainer.default_root_dir={tmp_path}",
              "--trainer.logger=false", "--trainer.enable_progress_bar=false"]  # fmt: skip
    main(["fit", *common])
    best = sorted(p for p in (tmp_path / "checkpoints").glob("epoch*.ckpt"))[-1]
    main(["test", *common, f"--ckpt_path={best}"])
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    gap = metrics["oracle_test_auc"] - metrics["test_auc"]
    assert -0.005 <= gap <= 0.01, metrics
