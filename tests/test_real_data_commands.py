"""The real-data study runs the shipped own-data configs with the README's own commands."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks` is a package at the repository root
    sys.path.insert(0, str(ROOT))

from benchmarks import real_data  # noqa: E402
from ssl_rec.cli import instantiate  # noqa: E402

OWN_KEYS = ["--data.path", "--data.label", "--data.dense", "--data.categorical"]


def _keys(args: list[str]) -> list[str]:
    return [a.partition("=")[0] for a in args]


def _readme_fit_configs() -> list[str]:
    """The ``--config`` of every ``ssl-rec fit`` of the README's own-data block."""
    body = (ROOT / "README.md").read_text().split("## Your own data\n", 1)[1]
    block = re.search(r"```bash\n(.*?)```", body, re.S).group(1)
    lines = re.sub(r"\\\n\s*", " ", block).splitlines()
    fits = [shlex.split(line) for line in lines if line.startswith("ssl-rec fit ")]
    return [argv[argv.index("--config") + 1] for argv in fits]


@pytest.mark.parametrize("dataset", sorted(real_data.DATASETS))
def test_study_commands_are_the_readme_own_data_commands(dataset: str) -> None:
    commands = real_data._commands(real_data.FULL, dataset)
    scratch = commands[f"scratch ({real_data.SHIPPED_SCRATCH})"]
    # From scratch: the README's first command, nothing added but the table's options.
    assert scratch[0] == "--config=configs/ctr/tabular.yaml"
    assert _keys(scratch[1:]) == OWN_KEYS
    assert scratch[1] == "--data.path=DIR"
    module = real_data.DATA_MODULES[dataset]
    assert f"--data.label={module.label_column}" in scratch
    # Pretrain -> fine-tune: the own-data pretraining configs, capped in epochs only.
    generative = commands["generative (pretraining)"]
    assert generative[0] == "--config=configs/pretrain/tabular.yaml"
    assert _keys(generative[1:]) == [*OWN_KEYS, "--trainer.max_epochs"]
    finetune = commands["generative (shipped)"]
    assert finetune[0] == "--config=configs/finetune/tabular.yaml"
    assert _keys(finetune[1:]) == [*OWN_KEYS, "--model.init_args.init_from"]
    # Every config the README's own-data section fits with is one the study runs as is.
    studied = {args[0].partition("=")[2] for args in commands.values()}
    readme = _readme_fit_configs()
    assert "configs/pretrain/tabular.yaml" in readme
    assert set(readme) <= studied


def test_every_config_the_study_runs_is_shipped() -> None:
    commands = real_data._commands(real_data.FULL, "ecommerce")
    assert {"joint (shipped)", "semi_supervised (info_nce weight=0.5)"} <= set(commands)
    named = [value for args in commands.values() for a in args
             if (value := a.partition("=")[2]).startswith("configs/")]  # fmt: skip
    assert named, "no config named"
    missing = [n for n in named if not (ROOT / n).is_file()]
    assert missing == []
    # Every pretraining reads the table through an own-data config (it takes --data.path).
    for name, args in commands.items():
        if name.endswith("(pretraining)"):
            configs = [a.partition("=")[2] for a in args if a.startswith(("--config=", "--data="))]
            text = "".join((ROOT / c).read_text() for c in configs)
            assert "ssl_rec.data.TabularDataModule" in text or "tabular_unlabeled" in text, name


def test_scratch_variants_change_what_they_name(tmp_path: Path, write_clicks) -> None:
    """Each knob of the grid reaches the model it builds (no variant is silently the default)."""
    path = tmp_path / "clicks.csv"
    write_clicks(path, n=400)
    own = ["--data.path", str(path), "--data.label", "clicked", "--data.dense", "[price]",
           "--data.categorical", "[user,item]",
           f"--data.init_args.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    base = [f"--config={ROOT / 'configs/ctr/tabular.yaml'}", *own, "--trainer.logger=false"]

    def build(variant: str):  # noqa: ANN202 - a LightningCLI
        extra = [real_data._absolute(a) for a in real_data.SCRATCH_VARIANTS[variant]]
        return instantiate([*base, *extra])

    shipped = build(real_data.SHIPPED_SCRATCH)

    def encoder(cli) -> dict:  # noqa: ANN001 - a LightningCLI
        return cli.model.hparams.backbone["init_args"]["encoder"]

    assert encoder(shipped)["class_path"].endswith("DeepFMEncoder")  # the study's choice
    assert encoder(shipped)["init_args"]["dropout"] == 0.2
    assert (shipped.model.hparams.wide, shipped.model.hparams.wide_init) == (True, "auto")
    assert shipped.model.wide.counts is not None
    assert build("deepfm, counts=false").model.wide.counts is None
    assert build("deepfm, wide=false").model.wide is None
    dlrm = build("dlrm")
    assert encoder(dlrm)["class_path"].endswith("DLRMEncoder")
    # The backbone file's DLRM with the config's dropout carried over: the former shipped one.
    assert encoder(dlrm)["init_args"] == {"bottom": [64], "top": [256, 128], "dropout": 0.2}
    assert dlrm.model.hparams.wide_init == "auto" and build("dlrm, wide=false").model.wide is None
    assert dlrm.model.wide.counts is not None
    assert build("dlrm, counts=false").model.wide.counts is None
    assert encoder(build("dlrm, dropout=0"))["init_args"]["dropout"] == 0
    tables = build("dlrm, tables weight_decay=1e-4").model.hparams.backbone["init_args"]["tables"]
    assert tables["weight_decay"] == pytest.approx(1e-4)
    assert build("dlrm, batch_size=1024").datamodule.hparams.batch_size == 1024
    dcnv2 = encoder(build("dcnv2, dropout=0.2"))
    assert dcnv2["class_path"].endswith("DCNv2Encoder")
    assert dcnv2["init_args"]["dropout"] == 0.2  # the config's dropout carries over


def test_each_seed_reads_its_own_split_in_the_library_and_the_peers(tmp_path: Path) -> None:
    """Seed ``s`` uses split seed ``s``: other test rows than seed 0, the same for both sides."""
    from benchmarks import _peers
    from ssl_rec.data import TabularDataModule

    cache = str(tmp_path / "cache")
    dataset, module = "ecommerce", real_data.DATA_MODULES["ecommerce"]

    def library_test_labels(seed: int) -> list[float]:
        dm = TabularDataModule(real_data.split_dir(dataset, cache, seed), module.label_column,
                               list(module.dense_columns), list(module.categorical_columns),
                               batch_size=4096, seed=seed, cache_dir=cache)  # fmt: skip
        dm.prepare_data()
        dm.setup("test")
        return [float(v) for b in dm.test_dataloader() for v in b.label]

    peers = {s: _peers.arrays(dataset, 1.0, s, cache)[0]["test"] for s in (0, 1)}
    assert len(peers[0][2]) == len(peers[1][2])
    assert not (peers[0][0] == peers[1][0]).all(), "seeds 0 and 1 test on the same rows"
    for seed, (_, _, labels) in peers.items():
        assert library_test_labels(seed) == labels.tolist()
