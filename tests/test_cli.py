"""The `ssl-rec` command line: fit/test on tiny synthetic data, and bad config values."""

import json

from ssl_rec.cli import main

TINY_DATA = [
    "--data.n_train", "30000", "--data.n_val", "5000", "--data.n_test", "10000",
    "--data.batch_size", "1024",
]  # fmt: skip


def _fit_args(root, config="configs/ctr/synthetic.yaml", *extra):
    return [
        "--config", config, "--trainer.default_root_dir", str(root),
        "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
        *TINY_DATA, *extra,
    ]  # fmt: skip


def test_fit_then_test_learns_and_writes_metrics(tmp_path):
    root = tmp_path / "run"
    main(["fit", *_fit_args(root), "--trainer.max_epochs", "2"])
    ckpt = root / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    main(["test", *_fit_args(root), "--ckpt_path", str(ckpt)])
    metrics = json.loads((root / "metrics.json").read_text())
    assert {"test_auc", "test_logloss", "test_ne", "oracle_test_auc"} <= set(metrics)
    assert metrics["test_auc"] > 0.65, metrics
    # The oracle is Bayes-optimal: beating it by more than the sampling noise of 10k test rows
    # (AUC standard error ~0.005) means a leak of the true probabilities.
    assert metrics["test_auc"] <= metrics["oracle_test_auc"] + 0.005
    assert metrics["test_ne"] < 1.0


def test_checkpoint_carries_schema_and_reloads(tmp_path):
    from ssl_rec.lightning import load_module, read_checkpoint, schema_of

    root = tmp_path / "run"
    main(["fit", *_fit_args(root), "--trainer.max_steps", "3", "--trainer.limit_val_batches", "1"])
    ckpt = root / "checkpoints" / "last.ckpt"
    schema = schema_of(read_checkpoint(ckpt))
    assert len(schema["categorical"]) == 26 and len(schema["dense"]) == 13
    module = load_module(ckpt)
    assert module.schema.n_fields == 26
