"""The `ssl-rec` command line: fit/test on tiny synthetic data, and bad config values."""

import json

import pytest

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
    assert metrics["test_auc"] <= metrics["oracle_test_auc"] + 0.02
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


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (["--model.init_args.learning_rate", "-1"], "learning_rate"),
        (["--data.label_fraction", "1.5"], "label_fraction"),
        (["--model.init_args.backbone.init_args.tables.precision", "int3"], "precision"),
    ],
)
def test_bad_config_values_fail_with_the_key(tmp_path, capsys, override, message):
    with pytest.raises((ValueError, SystemExit)) as err:
        main(["fit", *_fit_args(tmp_path), "--trainer.max_steps", "1", *override])
    captured = capsys.readouterr()
    assert message in str(err.value) + captured.err + captured.out


def test_missing_config_file_is_reported(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(tmp_path / "nope.yaml")])
    assert "nope.yaml" in capsys.readouterr().err


def _write_clicks_csv(path, n=3000, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    user = rng.integers(0, 40, n)
    item = (user // 4 * 7 + rng.integers(0, 3, n)) % 50  # items co-occur with user groups
    price = rng.gamma(2.0, 3.0, n).round(2)
    p = 1 / (1 + np.exp(-(np.where(user % 2 == 0, 1.5, -1.5) - 0.05 * price)))
    clicked = (rng.random(n) < p).astype(int)
    rows = ["clicked,price,user,item"] + [
        f"{c},{pr},u{u},i{it}" for c, pr, u, it in zip(clicked, price, user, item, strict=True)
    ]
    path.write_text("\n".join(rows) + "\n")


def test_tabular_csv_through_ctr_pretrain_and_finetune(tmp_path):
    csv = tmp_path / "clicks.csv"
    _write_clicks_csv(csv)
    data = [
        "--data", "ssl_rec.data.TabularDataModule", "--data.path", str(csv),
        "--data.label", "clicked", "--data.dense", "[price]",
        "--data.categorical", "[user,item]", "--data.batch_size", "256",
        "--data.cache_dir", str(tmp_path / "cache"),
    ]  # fmt: skip
    quiet = ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]
    ctr = tmp_path / "ctr"
    main(["fit", "--config", "configs/ctr/tabular.yaml", *data, *quiet,
          "--trainer.max_epochs", "4", "--trainer.default_root_dir", str(ctr)])  # fmt: skip
    main(["test", "--config", "configs/ctr/tabular.yaml", *data, *quiet,
          "--trainer.default_root_dir", str(ctr),
          "--ckpt_path", str(ctr / "checkpoints" / "last.ckpt")])  # fmt: skip
    assert json.loads((ctr / "metrics.json").read_text())["test_auc"] > 0.7

    pre = tmp_path / "pre"
    main(["fit", "--config", "configs/pretrain/mfp.yaml", *data, *quiet,
          "--data.use_labels", "false", "--trainer.max_epochs", "1",
          "--trainer.default_root_dir", str(pre)])  # fmt: skip
    ft = tmp_path / "ft"
    main(["fit", "--config", "configs/finetune/ctr.yaml", *data, *quiet,
          "--data.label_fraction", "0.5", "--trainer.max_epochs", "2",
          "--model.init_from", str(pre / "checkpoints" / "last.ckpt"),
          "--trainer.default_root_dir", str(ft)])  # fmt: skip
    assert (ft / "checkpoints" / "last.ckpt").is_file()
