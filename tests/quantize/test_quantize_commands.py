"""`ssl-rec quantize / explain / monitor / predict` on a tiny trained model, and bad input."""

import json

import pyarrow.parquet as pq
import pytest
import torch

from ssl_rec.cli import main

TINY = ["--data.n_train", "3000", "--data.n_val", "1000", "--data.n_test", "1000",
        "--data.batch_size", "512"]  # fmt: skip


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("ctr")
    main(["fit", "--config", "configs/ctr/synthetic.yaml", "--trainer.default_root_dir",
          str(root), "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
          "--trainer.max_steps", "6", "--trainer.limit_val_batches", "1", *TINY])  # fmt: skip
    return str(root / "checkpoints" / "last.ckpt")


def _fails(args, capsys, message):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err, err
    assert err.count("ssl-rec: error:") == 1


def test_quantize_predict_monitor_explain(ckpt, tmp_path, capsys):
    out = tmp_path / "q"
    main(["quantize", "--ckpt_path", ckpt, "--out", str(out), "--budget_ne", "0.001",
          "--calibration_rows", "1000", "--evaluation_rows", "1000"])  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    assert (
        abs(report["calibration_set"]["ne_quantized"] - report["calibration_set"]["ne_fp32"])
        <= 1e-3
    )
    assert report["search"]["order"] and set(report["choices"]) == {"tables", "layers"}
    pred = tmp_path / "pred.parquet"
    main(["predict", "--ckpt_path", str(out), "--out", str(pred)])
    table = pq.read_table(pred)
    assert table.column("row").to_pylist() == list(range(1000))
    from ssl_rec.cli.datamodules import datamodule_from, split_loader
    from ssl_rec.lightning import load_module

    module = load_module(ckpt).eval()
    with torch.no_grad():
        fp32 = torch.cat([torch.sigmoid(module(b)) for b in
                          split_loader(datamodule_from(ckpt, None), "test")])  # fmt: skip
    quantized = torch.tensor(table.column("probability").to_numpy())
    assert (quantized - fp32).abs().max() < 0.05
    main(["monitor", "--ckpt_path", ckpt, "--candidate", str(out)])
    main(["explain", "--ckpt_path", ckpt, "--candidate", str(out), "--rows", "1000"])
    assert "spent most by" in capsys.readouterr().out


def test_bad_inputs_are_one_line_errors(ckpt, tmp_path, capsys):
    base = ["quantize", "--ckpt_path", ckpt, "--out", str(tmp_path / "q")]
    _fails([*base, "--budget_ne", "0"], capsys, "--budget_ne must be > 0")
    _fails([*base, "--budget_ne", "-1"], capsys, "--budget_ne must be > 0")
    data = ["--data.class_path", "ssl_rec.data.SyntheticCTRDataModule"]
    _fails([*base, *data, "--data.init_args.n_train", "3000", "--data.init_args.n_val", "0"],
           capsys, "no rows")  # fmt: skip
    other = tmp_path / "other.csv"
    other.write_text("clicked,price,user\n" + "".join(f"{i % 2},{i}.5,u{i % 7}\n"
                                                      for i in range(300)))  # fmt: skip
    _fails([*base, "--data.class_path", "ssl_rec.data.TabularDataModule",
            "--data.init_args.path", str(other), "--data.init_args.label", "clicked",
            "--data.init_args.dense", "[price]", "--data.init_args.categorical", "[user]"],
           capsys, "C1")  # fmt: skip
    pretrain = tmp_path / "pretrain"
    main(["fit", "--config", "configs/pretrain/mfp.yaml", "--trainer.default_root_dir",
          str(pretrain), "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
          "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1", *TINY])  # fmt: skip
    _fails(["quantize", "--ckpt_path", str(pretrain / "checkpoints" / "last.ckpt"), "--out",
            str(tmp_path / "q2")], capsys, "not a CTR model")  # fmt: skip
