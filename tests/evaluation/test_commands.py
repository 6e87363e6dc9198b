import json
import math
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from ssl_rec.cli import main
from ssl_rec.data import SyntheticConfig, SyntheticCTRDataModule
from ssl_rec.evaluation import EmbeddingIndex
from ssl_rec.lightning import KNNProbeCallback, load_module

CONFIG = str(Path(__file__).parents[2] / "configs" / "ctr" / "synthetic.yaml")
SIZES = [
    "--data.init_args.n_train",
    "2000",
    "--data.init_args.n_val",
    "1000",
    "--data.init_args.n_test",
    "500",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("ctr")
    data = [*SIZES, "--data.init_args.cache_dir", str(root / "cache")]
    main(
        [
            "fit",
            "--config",
            CONFIG,
            "--trainer.default_root_dir",
            str(root / "run"),
            "--trainer.max_epochs",
            "1",
            "--trainer.logger",
            "false",
            "--trainer.enable_progress_bar",
            "false",
            "--data.init_args.batch_size",
            "500",
            "--model.init_args.backbone.init_args.tables.precision",
            "int8",
            *data,
        ]
    )
    flags = ["--data.class_path", "ssl_rec.data.SyntheticCTRDataModule", *data]
    return root / "run" / "checkpoints" / "last.ckpt", flags, root / "cache"


def test_export_cli_roundtrip(trained, tmp_path):
    ckpt, data, _ = trained
    out = tmp_path / "exp"
    main(
        [
            "export",
            "--ckpt_path",
            str(ckpt),
            "--out",
            str(out),
            "--fields",
            "[C3,C4]",
            "--split",
            "test",
            "--index",
            "HNSW32",
            "--precision",
            "fp32",
            *data,
        ]
    )
    idx = EmbeddingIndex.load(out)
    backbone = load_module(ckpt).backbone
    card = backbone.schema.field("C3").cardinality
    rows = backbone.entity_vectors("C3", torch.arange(1, card))  # id 0 (missing) is left out
    np.testing.assert_array_equal(idx.vectors("C3"), rows.numpy())
    assert idx.vocabulary.id_values("C3").to_pylist()[1:] == idx.keys("C3").tolist()
    assert backbone.embedding.specs[0].precision == "int8"
    assert idx.vectors("split_test").shape == (500, backbone.dims.output_dim)
    raw = idx.keys("C3")[7]
    np.testing.assert_array_equal(idx.vector("C3", raw), rows[7].numpy())
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["source_checkpoint"]["sha256"]) == 64
    assert manifest["sets"]["C3"]["index"]["search_params"] == {"efSearch": 64}


def test_export_cli_bad_flag_is_clear(trained, tmp_path, capsys):
    ckpt, _, cache = trained
    with pytest.raises(SystemExit):
        main(["export", "--ckpt_path", str(ckpt), "--out", str(tmp_path / "e"), "--metric", "cos"])
    assert "metric" in capsys.readouterr().err


def test_export_split_rebuilds_data_module_from_checkpoint(trained, tmp_path):
    from ssl_rec.evaluation import EmbeddingIndex

    ckpt, _, _ = trained
    out = tmp_path / "e"
    main(["export", "--ckpt_path", str(ckpt), "--out", str(out), "--fields", "[C1]", "--split",
          "test", "--max_rows", "300"])  # fmt: skip
    index = EmbeddingIndex.load(out)
    assert any(name.startswith("split_") for name in index.set_names)


def test_evaluate_cli_writes_json(trained, tmp_path, capsys):
    ckpt, data, _ = trained
    out = tmp_path / "eval.json"
    main(
        [
            "evaluate-embeddings",
            "--ckpt_path",
            str(ckpt),
            "--json_out",
            str(out),
            "--train_rows",
            "1000",
            "--test_rows",
            "500",
            *data,
        ]
    )
    results = json.loads(out.read_text())
    assert 0.0 <= results["knn_probe"]["auc"] <= 1.0
    assert math.isfinite(results["geometry"]["uniformity"])
    assert results["retrieval"]["ann_recall@10"] == 1.0  # Flat at this size: exact
    assert "knn_probe.auc" in capsys.readouterr().out


def test_knn_probe_callback_logs(trained, tmp_path):
    ckpt, _, cache = trained
    module = load_module(ckpt)
    dm = SyntheticCTRDataModule(
        2000, 1000, 500, SyntheticConfig(), batch_size=500, cache_dir=str(cache)
    )
    cb = KNNProbeCallback(bank_rows=600, probe_rows=400, k=20)
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=1,
        limit_val_batches=0,
        logger=False,
        callbacks=[cb],
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(module, datamodule=dm)
    assert 0.0 <= cb.last["auc"] <= 1.0
    assert "knn/auc" in trainer.callback_metrics
    with pytest.raises(ValueError, match="every_n_epochs"):
        KNNProbeCallback(every_n_epochs=0)


def test_evaluate_pretraining_checkpoint_probes_with_labels(tmp_path):
    """A pretraining run read its rows without labels; evaluation still probes with them."""
    root = tmp_path / "pre"
    config = str(Path(__file__).parents[2] / "configs" / "pretrain" / "mfp.yaml")
    main(["fit", "--config", config, "--trainer.default_root_dir", str(root),
          "--trainer.max_steps", "2", "--trainer.logger", "false",
          "--trainer.limit_val_batches", "1", "--data.init_args.batch_size", "500",
          "--data.init_args.cache_dir", str(tmp_path / "cache"), *SIZES])  # fmt: skip
    out = tmp_path / "eval.json"
    main(["evaluate-embeddings", "--ckpt_path", str(root / "checkpoints" / "last.ckpt"),
          "--json_out", str(out), "--train_rows", "1000", "--test_rows", "500"])  # fmt: skip
    results = json.loads(out.read_text())
    assert "probes_skipped" not in results
    assert 0.0 <= results["knn_probe"]["auc"] <= 1.0
