"""A trained model is a self-contained artifact: vocabulary, standalone checkpoints, run dirs.

Pretraining on file A and fine-tuning on file B whose values are ranked differently must
look every raw value's pretrained row up by value; ``ssl-rec test`` / ``predict`` work from
the checkpoint alone; a second fit into a run directory is refused.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ssl_rec.cli import instantiate, run
from ssl_rec.data import TabularDataModule
from ssl_rec.lightning import CTRModule, load_module, read_checkpoint
from ssl_rec.vocab import CodedColumn

ROOT = Path(__file__).resolve().parents[1]
SHOPS = [f"s{i}" for i in range(12)]
QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false"]


def write_clicks(path: Path, n: int, seed: int, reverse: bool = False, extra: str = "") -> Path:
    """Clicks on 12 shops; ``reverse`` flips the shops' popularity (same cardinalities)."""
    rng = np.random.default_rng(seed)
    p = np.arange(12, 0, -1.0) ** 2
    shop = rng.choice(12, n, p=(p[::-1] if reverse else p) / p.sum())
    user, price = rng.integers(0, 30, n), rng.gamma(2.0, 3.0, n).round(2)
    logit = np.where(shop % 3 == 0, 1.5, -1.0) + np.where(user % 2 == 0, 0.8, -0.8) - 0.05 * price
    click = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
    rows = [
        f"{c},{pr},u{u},{SHOPS[s]}" for c, pr, u, s in zip(click, price, user, shop, strict=True)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(["clicked,price,user,shop", *rows]) + "\n" + extra)
    return path


def data_args(path: Path, cache: Path) -> list[str]:
    return ["--data", "ssl_rec.data.TabularDataModule", f"--data.path={path}",
            "--data.label=clicked", "--data.dense=[price]", "--data.categorical=[user,shop]",
            "--data.batch_size=256", f"--data.cache_dir={cache}"]  # fmt: skip


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Pretraining on file A, and a directory B (train/valid/test) ranked the other way."""
    root = tmp_path_factory.mktemp("artifacts")
    a = write_clicks(root / "A.csv", 3000, seed=10)
    b = root / "B"
    for name, seed in (("train", 11), ("valid", 12), ("test", 13)):
        write_clicks(b / f"{name}.csv", 1500, seed=seed, reverse=True)
    run(["fit", "--config", str(ROOT / "configs/pretrain/mfp.yaml"), *data_args(a, root / "cache"),
         "--data.use_labels=false", "--trainer.max_epochs=1", *QUIET,
         f"--trainer.default_root_dir={root / 'pre'}"])  # fmt: skip
    return {"root": root, "A": a, "B": b, "ckpt": root / "pre" / "checkpoints" / "last.ckpt"}


def _rows(module: torch.nn.Module, values: list[str]) -> torch.Tensor:
    column = CodedColumn.from_column(pa.array(values))
    ids = torch.from_numpy(module.vocabulary["shop"].encode(column).astype(np.int64))
    return module.backbone.entity_vectors("shop", ids)


def test_finetuning_on_another_file_looks_rows_up_by_value(pretrained, tmp_path) -> None:
    own = TabularDataModule(str(pretrained["B"]), "clicked", ["price"], ["user", "shop"],
                            cache_dir=str(tmp_path / "own"))  # fmt: skip
    source = load_module(pretrained["ckpt"])
    # B's own ranking differs from A's, so attaching rows by id would mix shops up.
    assert "shop" in own.vocabulary.disagreeing(source.vocabulary)
    assert own.schema.cardinalities == source.schema.cardinalities
    cli = instantiate(["--config", str(ROOT / "configs/finetune/ctr.yaml"),
                       *data_args(pretrained["B"], tmp_path / "cache"),
                       "--data.label_fraction=1.0", *QUIET,
                       f"--model.init_args.init_from={pretrained['ckpt']}"])  # fmt: skip
    torch.testing.assert_close(_rows(cli.model, SHOPS), _rows(source, SHOPS), rtol=0, atol=0)
    # The batches carry the ids of their raw values in that vocabulary.
    batch = next(iter(cli.datamodule.train_dataloader()))
    raw = np.loadtxt(pretrained["B"] / "train.csv", dtype=str, delimiter=",", skiprows=1)[:, 3]
    names = np.asarray(cli.model.vocabulary.id_values("shop").to_pylist())
    np.testing.assert_array_equal(names[batch.sparse[:, 1].numpy()], raw[batch.row_id.numpy()])
    # From Python, data encoded with its own vocabulary is refused, naming the field.
    with pytest.raises(ValueError, match="shop"):
        CTRModule(
            cli.model.hparams.backbone, own.schema.to_dict(), init_from=str(pretrained["ckpt"])
        )


def test_test_and_predict_from_the_checkpoint_alone(pretrained, tmp_path, monkeypatch) -> None:
    ft = tmp_path / "ft"
    run(["fit", "--config", str(ROOT / "configs/finetune/ctr.yaml"),
         *data_args(pretrained["B"], tmp_path / "cache"), "--data.label_fraction=1.0", *QUIET,
         "--trainer.max_epochs=1", f"--trainer.default_root_dir={ft}",
         f"--model.init_args.init_from={pretrained['ckpt']}"])  # fmt: skip
    ckpt = ft / "checkpoints" / "last.ckpt"
    assert read_checkpoint(ckpt)["hyper_parameters"]["init_from"] is None
    write_clicks(tmp_path / "new" / "C.csv", 400, seed=14, extra="1,2.5,u999,s999\n")
    gone = tmp_path / "moved"
    shutil.move(pretrained["ckpt"].parent.parent, gone)  # the pretraining run is gone ...
    shutil.rmtree(tmp_path / "cache")  # ... and so is the training cache
    monkeypatch.chdir(tmp_path / "new")
    try:
        common = [f"--ckpt_path={ckpt}", "--data.path=C.csv", "--data.cache_dir=cache2", *QUIET]
        run(["test", *common, "--trainer.default_root_dir=out"])
        metrics = json.loads(Path("out/metrics.json").read_text())
        assert 0.5 < metrics["test_auc"] <= 1.0
        run(["predict", *common, "--trainer.default_root_dir=out",
             "--predictions.out=pred.parquet", "--predictions.keys=[user,shop]"])  # fmt: skip
    finally:
        shutil.move(gone, pretrained["ckpt"].parent.parent)
    pred = pq.read_table("pred.parquet").to_pydict()
    raw = np.loadtxt("C.csv", dtype=str, delimiter=",", skiprows=1)
    assert pred["row"] == list(range(len(raw)))  # one row per input row, in input order
    assert pred["user"] == raw[:, 2].tolist() and pred["shop"] == raw[:, 3].tolist()
    assert all(0.0 < p < 1.0 for p in pred["probability"])
    schemas = [json.loads(p.read_text()) for p in Path("cache2").glob("tabular-*/schema.json")]
    whole = [s for s in schemas if s["metadata"]["options"]["test_fraction"] == 1.0]
    assert whole[0]["metadata"]["unseen_values"]["test"] == {"user": 1, "shop": 1}


def test_a_second_fit_into_a_run_directory_is_refused(pretrained, tmp_path) -> None:
    root = tmp_path / "run"
    args = ["--config", str(ROOT / "configs/ctr/tabular.yaml"),
            *data_args(pretrained["A"], tmp_path / "cache"), *QUIET,
            f"--trainer.default_root_dir={root}"]  # fmt: skip
    run(["fit", *args, "--trainer.max_epochs=1"])
    last = root / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    with pytest.raises(ValueError, match="already holds a fit"):
        run(["fit", *args, "--trainer.max_epochs=2"])
    assert last.read_bytes() == before
    config = (root / "config.yaml").read_text()
    run(["test", *args, f"--ckpt_path={last}"])
    assert (root / "config.yaml").read_text() == config  # test writes test_config.yaml
    assert (root / "test_config.yaml").is_file()
