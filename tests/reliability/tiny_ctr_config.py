"""The config file of a tiny, seeded, quiet CTR fit (DLRM backbone, synthetic data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def write_tiny_ctr_config(directory: Path, trainer: dict[str, Any], data: dict[str, Any]) -> Path:
    """Write ``directory/run.yaml``: ``seed_everything: 0``, a CTRModule on the shipped DLRM
    backbone, ``SyntheticCTRDataModule`` data; no logger, bars, summary or sanity steps.

    Args:
        directory: existing directory receiving ``run.yaml``.
        trainer: more trainer settings (they win over the quiet defaults).
        data: the data module's ``init_args`` (sizes, batch size, cache directory).

    Returns:
        The path of ``run.yaml``.

    """
    config = {
        "seed_everything": 0,
        "trainer": {"logger": False, "enable_progress_bar": False, "enable_model_summary": False,
                    "num_sanity_val_steps": 0, **trainer},
        "model": {"class_path": "ssl_rec.lightning.CTRModule",
                  "init_args": {"backbone": str(ROOT / "configs/common/backbone/dlrm.yaml")}},
        "data": {"class_path": "ssl_rec.data.SyntheticCTRDataModule", "init_args": data},
    }  # fmt: skip
    path = directory / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
