"""Label-efficiency study: does self-supervised pretraining help CTR with few labels?

Pretrains one backbone per (family, seed) on a large unlabeled synthetic pool, then
fine-tunes it on labeled fractions of the same rows and compares test AUC with a backbone
trained from scratch on the same labels (same seeds, same labeled subsets). Families:
generative (masked feature prediction + dense reconstruction), contrastive (InfoNCE and
MoCo), generative-contrastive (replaced feature detection, ELECTRA-style) and adversarial
(adversarial feature replacement). Every choice (a family's objective, the tables' step for
scratch and pretrained alike, the epoch) is made on validation AUC; test AUC is computed
once per final setting.
The JSON holds every variant's validation AUC, mean ± std of test AUC, paired per-seed
differences against scratch, the oracle, the preset and the git commit; a plot beside it.

    python benchmarks/label_efficiency.py --preset hard [--seeds 0 1 2] \
        --json benchmarks/results/label_efficiency_hard.json
    python benchmarks/label_efficiency.py --quick --json /tmp/ssl.json   # smoke run

Every run is built from the shipped YAML configs (``configs/pretrain/*.yaml`` per family and
``configs/finetune/ctr.yaml``) with size overrides.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # `python benchmarks/label_efficiency.py`: import the package from the root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch

from benchmarks._harness import Figure, Recording, benchmark_parser, chosen_seeds, pyplot
from benchmarks._selection import BestValAUC, Run, paired, select, table
from ssl_rec.cli import instantiate

warnings.filterwarnings("ignore", ".*LeafSpec.*")
warnings.filterwarnings("ignore", ".*does not have many workers.*")

ROOT = Path(__file__).resolve().parents[1]
# The shipped pretraining configs of each family; a family with several chooses on validation.
FAMILY_CONFIGS = {
    "generative": {"mfp": ROOT / "configs/pretrain/mfp.yaml"},
    "contrastive": {
        "infonce": ROOT / "configs/pretrain/contrastive.yaml",
        "moco": ROOT / "configs/pretrain/moco.yaml",
    },
    "generative_contrastive": {"rfd": ROOT / "configs/pretrain/rfd.yaml"},
    "adversarial": {"afr": ROOT / "configs/pretrain/adversarial.yaml"},
}
# Step of the tables' fused optimizer tried for every run, pretrained or from scratch (None:
# the TableSpec's 0.05), so both sides of a comparison choose among the same steps; the
# choice is made on validation AUC.
EMBEDDING_LRS: tuple[float | None, ...] = (None, 0.01)
FINETUNE_CONFIG = ROOT / "configs/finetune/ctr.yaml"
QUIET = ["--trainer.logger=false", "--trainer.enable_checkpointing=false",
         "--trainer.callbacks=null", "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false"]  # fmt: skip


@dataclass(frozen=True)
class Sizes:
    pool: int
    n_test: int
    fractions: tuple[float, ...]
    seeds: tuple[int, ...]
    pretrain_epochs: int
    pretrain_batch: int
    finetune_rows: int  # labeled rows seen per fine-tuning run (epochs = rows / labeled)
    max_epochs: int


FULL = Sizes(300_000, 50_000, (0.01, 0.1, 1.0), (0, 1, 2), 1, 1024, 600_000, 10)
QUICK = Sizes(40_000, 10_000, (0.02, 1.0), (0,), 1, 512, 40_000, 5)


def data_args(sizes: Sizes, batch_size: int, seed: int, preset: str) -> list[str]:
    """The same synthetic pool for every run (the data's own seed is fixed)."""
    return [
        f"--data.init_args.preset={preset}",
        f"--data.init_args.n_train={sizes.pool}",
        f"--data.init_args.n_val={sizes.n_test}",
        f"--data.init_args.n_test={sizes.n_test}",
        f"--data.init_args.batch_size={batch_size}",
        "--data.init_args.eval_batch_size=4096",
        f"--data.init_args.seed={seed}",
        f"--seed_everything={seed}",
    ]


def pretrain(sizes: Sizes, config: Path, seed: int, out_dir: Path, preset: str) -> Path:
    """Pretrain with ``config`` on the unlabeled pool; the checkpoint's path."""
    cli = instantiate(["--config", str(config), *QUIET,
                       *data_args(sizes, sizes.pretrain_batch, seed, preset),
                       f"--trainer.max_epochs={sizes.pretrain_epochs}",
                       "--trainer.limit_val_batches=0"])  # fmt: skip
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    path = out_dir / f"{config.stem}_seed{seed}.ckpt"
    cli.trainer.save_checkpoint(path)
    return path


def finetune(
    sizes: Sizes,
    fraction: float,
    seed: int,
    init_from: Path | None,
    embedding_lr: float | None,
    preset: str,
) -> Run:
    """Fine-tune (or train from scratch); ``(best val AUC, test AUC thunk of that epoch)``."""
    labeled = max(1, round(fraction * sizes.pool))
    batch = int(min(4096, max(256, labeled // 50)))
    epochs = int(min(sizes.max_epochs, max(1, round(sizes.finetune_rows / labeled))))
    model = [f"--model.init_args.init_from={init_from}"] if init_from else []
    model.append(f"--model.init_args.embedding_lr={embedding_lr or 'null'}")
    run = [f"--data.init_args.label_fraction={fraction}", f"--trainer.max_epochs={epochs}",
           "--trainer.num_sanity_val_steps=0"]  # fmt: skip
    cli = instantiate(["--config", str(FINETUNE_CONFIG), *QUIET, *model,
                       *data_args(sizes, batch, seed, preset), *run])  # fmt: skip
    best = BestValAUC()
    cli.trainer.callbacks.append(best)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)

    def test() -> float:
        cli.model.load_state_dict(best.state)
        metrics = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)[0]
        return float(metrics["test/auc"])

    return best.best, test


def plot(results: dict) -> Figure:
    """Test AUC against the labeled fraction, one line per family and scratch; the oracle."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, per_fraction in results.items():
        if name == "oracle":
            ax.axhline(per_fraction["auc"], color="k", linestyle=":", label="oracle")
            continue
        xs = sorted(float(f) for f in per_fraction)
        ys = [per_fraction[str(x)]["mean"] for x in xs]
        errs = [per_fraction[str(x)]["std"] for x in xs]
        style = "--" if name == "scratch" else "-"
        ax.errorbar(xs, ys, yerr=errs, fmt=style, marker="o", capsize=3, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("labeled fraction of the pool")
    ax.set_ylabel("test AUC (mean over seeds)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def run(sizes: Sizes, families: list[str], preset: str, log: Callable[[str], None]) -> dict:
    results: dict = {"scratch": {}}
    with tempfile.TemporaryDirectory(prefix="ssl_bench_") as tmp:
        for fraction in sizes.fractions:
            runs = {f"embedding_lr={lr or 'backbone'}": {
                s: finetune(sizes, fraction, s, None, lr, preset) for s in sizes.seeds}
                for lr in EMBEDDING_LRS}  # fmt: skip
            results["scratch"][str(fraction)] = select(runs)
            log(f"scratch f={fraction}: {results['scratch'][str(fraction)]['mean']:.4f}")
        for family in families:
            ckpts = {(name, s): pretrain(sizes, config, s, Path(tmp), preset)
                     for name, config in FAMILY_CONFIGS[family].items()
                     for s in sizes.seeds}  # fmt: skip
            log(f"pretrained {family}")
            for fraction in sizes.fractions:
                runs = {f"{name}, embedding_lr={lr or 'backbone'}": {
                    s: finetune(sizes, fraction, s, ckpts[name, s], lr, preset)
                    for s in sizes.seeds}
                    for name in FAMILY_CONFIGS[family] for lr in EMBEDDING_LRS}  # fmt: skip
                results.setdefault(family, {})[str(fraction)] = select(runs)
                log(f"{family} f={fraction}: {results[family][str(fraction)]['mean']:.4f}")
    return results


def main() -> None:
    """Parse arguments, run the study, write JSON + PNG, print the table and the comparisons."""
    parser = benchmark_parser(__doc__.splitlines()[0], seeds=True)
    parser.add_argument(
        "--preset",
        choices=("easy", "hard"),
        default="easy",
        help="difficulty of the synthetic data (SyntheticConfig presets)",
    )
    parser.add_argument("--families", default=",".join(FAMILY_CONFIGS))
    parser.add_argument("--scratch-only", action="store_true")
    args = parser.parse_args()
    record = Recording(__file__)  # the code version this run starts from
    os.environ.setdefault("WANDB_MODE", "offline")
    # One thread: on a shared 2-core host, OpenMP barriers of a second thread made the many
    # small ops of these models ~10x slower (measured: 0.5 s vs 0.04 s per backward).
    torch.set_num_threads(1)
    families = [] if args.scratch_only else args.families.split(",")
    unknown = set(families) - set(FAMILY_CONFIGS)
    if unknown:
        parser.error(f"--families: unknown {sorted(unknown)}; allowed {list(FAMILY_CONFIGS)}")
    sizes, start = QUICK if args.quick else FULL, time.time()
    sizes = dataclasses.replace(sizes, seeds=chosen_seeds(args, FULL.seeds))

    def log(msg: str) -> None:
        print(f"[{time.time() - start:6.0f}s] {msg}", flush=True)

    results = run(sizes, families, args.preset, log)
    fractions = [str(f) for f in sizes.fractions]
    comparisons = {f"{fam} - scratch": {f: paired(results, fam, "scratch", f) for f in fractions}
                   for fam in families}  # fmt: skip
    cli = instantiate(["--config", str(FINETUNE_CONFIG), *QUIET,
                       *data_args(sizes, 4096, 0, args.preset)])  # fmt: skip
    out = {"results": results, "oracle": cli.datamodule.oracle_metrics("test"),
           "paired": comparisons,
           "config": {**sizes.__dict__, "preset": args.preset, "embedding_lrs": EMBEDDING_LRS,
                      "seconds": round(time.time() - start)}}  # fmt: skip
    record.write(args.json, out, lambda r: plot({**r["results"], "oracle": r["oracle"]}), dpi=120)
    print(table(results, fractions, lambda f: f"test AUC, {float(f):.0%} labels"))
    print(f"oracle test AUC {out['oracle']['auc']:.4f} (preset {args.preset})")
    print(json.dumps(comparisons, indent=1))


if __name__ == "__main__":
    main()
