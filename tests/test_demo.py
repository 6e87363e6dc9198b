"""`make demo` end to end (every stage through the CLI) on tiny data."""

from __future__ import annotations

import json

from ssl_rec.cli import demo

TINY = ["--data.n_train", "3000", "--data.n_val", "600", "--data.n_test", "1000",
        "--data.batch_size", "500", "--data.synthetic.cardinality_scale", "0.0002",
        "--trainer.max_epochs", "1", "--trainer.logger", "false",
        "--trainer.enable_progress_bar", "false"]  # fmt: skip


def test_demo_runs_every_stage_and_writes_its_report(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(demo, "DEMO_DATA", TINY)
    report = demo.run_demo(tmp_path, 0.2, "configs/pretrain/mfp_contrastive.yaml")
    assert json.loads((tmp_path / "report.json").read_text()) == report
    few = report["few_labels"]
    for auc in (report["test_auc"], few["scratch_test_auc"], few["pretrained_test_auc"]):
        assert 0.5 < auc < report["oracle_test_auc"] + 0.02
    assert (tmp_path / "pretrain" / "checkpoints" / "last.ckpt").is_file()
