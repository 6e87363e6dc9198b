"""``make demo``: the main job end to end on built-in synthetic Criteo-like data.

1. a DLRM CTR model trained on all labels, tested against the oracle (Bayes-optimal) AUC;
2. self-supervised pretraining on the label-free pool, fine-tuned on a small labeled
   fraction, compared with the same model trained from scratch on those labels.

Every stage runs through the ``ssl-rec`` command line with the shipped YAML configs, and the
figures land in ``<out>/report.json``; the output ends with where the report, the runs and
their W&B offline runs are, and a command to try next (:func:`closing_summary`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from ssl_rec._io import atomic_write_json
from ssl_rec.cli import main as ssl_rec
from ssl_rec.cli.run_outputs import wandb_group

# The default synthetic data (1M training rows); a smaller validation split saves time.
DEMO_DATA = ["--data.n_val", "50000", "--data.n_test", "100000"]
# The stages, in order: each a run directory under --out.
STAGES = ("ctr_full_labels", "ctr_few_labels_scratch", "pretrain", "ctr_few_labels_pretrained")
NEXT_COMMAND = (
    "ssl-rec fit --config configs/ctr/tabular.yaml --data.path clicks.csv --data.label clicked "
    "--data.dense '[price]' --data.categorical '[user,item]'"
)


def _end_wandb_run() -> None:
    """Close the W&B run a stage opened, so the next stage logs to a run of its own."""
    wandb = sys.modules.get("wandb")  # imported only if a stage logged to W&B
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()


def _run(out: Path, name: str, config: str, extra: list[str], test: bool = True) -> dict[str, Any]:
    """Fit ``config`` into ``out/name`` (and test its best checkpoint); return metrics.json."""
    root = out / name
    shutil.rmtree(root, ignore_errors=True)  # stale checkpoints would be picked as "best"
    common = ["--config", config, "--trainer.default_root_dir", str(root), *DEMO_DATA, *extra]
    ssl_rec(["fit", *common])
    _end_wandb_run()
    if not test:
        return {}
    ssl_rec(["test", *common, "--ckpt_path", str(best_checkpoint(root))])
    _end_wandb_run()
    return json.loads((root / "metrics.json").read_text())


def best_checkpoint(root: Path) -> Path:
    """The monitored (best) checkpoint under ``root/checkpoints``, else ``last.ckpt``."""
    found = sorted(p for p in (root / "checkpoints").glob("*.ckpt") if p.stem != "last")
    return found[-1] if found else root / "checkpoints" / "last.ckpt"


def run_demo(out: Path, label_fraction: float, pretrain_config: str) -> dict[str, Any]:
    """Run every stage and return the report (also written to ``out/report.json``).

    Each stage's fit is a W&B run of its own (its test logs into it), all in one group named
    after ``out`` and the start time.
    """
    with wandb_group(f"{out.absolute().name}-{time.strftime('%Y%m%d-%H%M%S')}"):
        return _run_stages(out, label_fraction, pretrain_config)


def _run_stages(out: Path, label_fraction: float, pretrain_config: str) -> dict[str, Any]:
    start = time.time()
    full = _run(out, STAGES[0], "configs/ctr/synthetic.yaml", [])
    few = ["--data.label_fraction", str(label_fraction)]
    scratch = _run(out, STAGES[1], "configs/finetune/ctr.yaml", few)
    _run(out, STAGES[2], pretrain_config, [], test=False)
    ckpt = out / STAGES[2] / "checkpoints" / "last.ckpt"
    finetuned = _run(
        out, STAGES[3], "configs/finetune/ctr.yaml", [*few, "--model.init_from", str(ckpt)]
    )
    report = {
        "test_auc": full["test_auc"],
        "test_logloss": full["test_logloss"],
        "test_ne": full.get("test_ne"),
        "oracle_test_auc": full["oracle_test_auc"],
        "oracle_test_logloss": full["oracle_test_logloss"],
        "few_labels": {
            "label_fraction": label_fraction,
            "pretrain_config": pretrain_config,
            "scratch_test_auc": scratch["test_auc"],
            "pretrained_test_auc": finetuned["test_auc"],
            "scratch_test_logloss": scratch["test_logloss"],
            "pretrained_test_logloss": finetuned["test_logloss"],
        },
        "seconds": round(time.time() - start, 1),
    }
    atomic_write_json(out / "report.json", report)
    return report


def _print(report: dict[str, Any]) -> None:
    few = report["few_labels"]
    pct = f"{few['label_fraction']:.0%} labels"
    rows = [
        ("CTR, all labels", report["test_auc"], report["test_logloss"]),
        ("oracle (true probability)", report["oracle_test_auc"], report["oracle_test_logloss"]),
        (f"scratch, {pct}", few["scratch_test_auc"], few["scratch_test_logloss"]),
        (f"pretrained, {pct}", few["pretrained_test_auc"], few["pretrained_test_logloss"]),
    ]
    print(f"\n{'model':<36}{'test AUC':>10}{'logloss':>10}")
    for name, auc, logloss in rows:
        print(f"{name:<36}{auc:>10.4f}{logloss:>10.4f}")
    gap = report["oracle_test_auc"] - report["test_auc"]
    print(f"\nAUC gap to oracle: {gap:.4f}; took {report['seconds']:.0f} s")


def closing_summary(out: Path) -> list[str]:
    """The demo's last lines: its runs, their W&B offline runs, what to try next, the report.

    The report comes last: a log's last line says where the results are.
    """
    runs = [out / name for name in STAGES if (out / name).is_dir()]
    offline = sorted(out.glob("*/wandb/offline-run-*"))
    lines = ["", f"runs (config.yaml, checkpoints/, metrics.json): {', '.join(map(str, runs))}"]
    if offline:
        lines.append(f"W&B offline runs: {len(offline)} in <run>/wandb/ (upload them: "
                     f"wandb sync {out}/*/wandb/offline-run-*)")  # fmt: skip
    lines += [
        "next: `source .venv/bin/activate` puts ssl-rec on the PATH (or run .venv/bin/ssl-rec);",
        f"  then try your own data (README, 'Your own data'): {NEXT_COMMAND}",
        f"report: {out / 'report.json'}",
    ]
    return lines


def main(argv: list[str] | None = None) -> None:
    """Parse ``--out`` / ``--label-fraction`` / ``--pretrain-config`` and run the demo."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/demo"))
    parser.add_argument("--label-fraction", type=float, default=0.01)
    parser.add_argument("--pretrain-config", default="configs/pretrain/mfp_contrastive.yaml")
    args = parser.parse_args(argv)
    if not 0.0 < args.label_fraction <= 1.0:
        parser.error(f"--label-fraction must be in (0, 1], got {args.label_fraction}")
    _print(run_demo(args.out, args.label_fraction, args.pretrain_config))
    print("\n".join(closing_summary(args.out)))


if __name__ == "__main__":
    main()
