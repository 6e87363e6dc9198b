"""Candidate retrieval on MovieLens-100k: the library's two towers against peers, 3 seeds.

On the per-user split of ``docs/retrieval.md`` (rating >= 4 = positive; each user's last
tenth of positives, at least one, is test and the tenth before it validation: 5,552 positives
each; every movie the user rated outside those is excluded from its ranking, on test its
validation movies too), every model ranks all 1,682 movies once per held-out positive
(recall@10 and NDCG@10 averaged over the held-out positives of 942 users):

- the library's two towers (``RetrievalModule``, :mod:`benchmarks._retrieval_towers`):
  ``two_tower_fp32`` (FP32 tables, in-batch sampled softmax), ``two_tower_ssl`` (the same
  plus ``ComplementaryInfoNCE`` on items drawn uniformly from the catalogue, Yao et al.
  2021) and
  ``two_tower_int8_cache`` (the chosen FP32 variant with INT8 tables and a 5% FP32 cache);
- peers from their own packages (:mod:`benchmarks._retrieval_peers`): most-popular,
  ``implicit``'s item-kNN (cosine), ALS and BPR.

The towers' settings (:class:`~benchmarks._retrieval_towers.TowerConfig`: D = 32, an MLP
[64] to 32 unit dimensions per tower, temperature 0.1, 1,024 uniform negatives per batch
beside the in-batch ones, log-Q from the training counts, up to 20 epochs, the movie's id,
genre set, genres one by one, year and decade in the item tower) were chosen on validation;
the grid (:func:`grids`) tries the item-side self-supervision with complementary views on
uniformly drawn items and on the batch's items (weight 0.1), and with independent views and
a projection head on uniformly drawn items (weight 0.3), and pretraining without
interactions (two epochs of the item tower alone with the self-supervision on uniformly drawn
catalogue items, then the batch items' variant for 20 epochs). The epoch and the peers' variants
are chosen on mean validation recall@10 over the seeds, the self-supervision's variant on
mean validation tail recall@10 (:data:`CHOICE_METRIC`); the test figures of the chosen
variant are reported as mean and sample standard deviation over seeds. ``ssl_tail_gain`` is
the per-seed test tail-recall@10 of ``two_tower_ssl`` minus that of ``two_tower_fp32``
(tail: the 80% least popular movies of training); ``int8_recall_gap`` the per-seed test
recall@10 of ``two_tower_int8_cache`` minus ``two_tower_fp32``. Each seed runs in a fresh
process with one thread, two at a time; ``cpu_seconds_per_seed`` sums the CPU time of a
seed's runs.

``--serving`` adds (or, with ``--serving-only``, only runs) the serving figure: top-100 over a
1M-item synthetic catalogue of clustered unit vectors with the export's default index
(``auto``), queries/s in batches, single-query p50/p99 latency and recall@100 against exact
search, on one thread.

    python benchmarks/retrieval_real.py --json OUT [--seeds 0 1 2] [--serving]
    python benchmarks/retrieval_real.py --quick --json /tmp/retrieval_real.json
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if not __package__:  # `python benchmarks/retrieval_real.py`: import the package from the root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import numpy as np

from benchmarks._fresh_process import run_in_fresh_process
from benchmarks._harness import Recording, benchmark_parser, chosen_seeds, pyplot
from benchmarks._selection import choose as choose_variant
from benchmarks._selection import mean_std, seed_diffs

SEEDS = (0, 1, 2)
METRICS = ("recall_at_10", "ndcg_at_10", "tail_recall_at_10")
LIBRARY = ("two_tower_fp32", "two_tower_ssl", "two_tower_int8_cache")
CHOICE_METRIC = {"two_tower_ssl": "tail_recall_at_10"}


def grids(quick: bool) -> dict[str, list[dict]]:
    """``variant -> [TowerConfig kwargs]`` of the library's grids (the INT8 variant has none)."""
    if quick:
        base = {"epochs": 2, "item_fields": "rich"}
        return {"two_tower_fp32": [base], "two_tower_ssl": [{**base, "ssl_weight": 0.1}]}
    fp32 = [{"item_fields": "rich"}]
    ssl = [{"item_fields": "rich", "ssl_weight": 0.1, "ssl_items": i} for i in ("uniform", "batch")]
    ssl.append({"item_fields": "rich", "ssl_weight": 0.3, "ssl_items": "uniform",
                "ssl_views": "independent"})  # fmt: skip
    # pretraining without interactions: 2 epochs of item self-supervision alone, then 20 joint
    ssl.append({"item_fields": "rich", "ssl_weight": 0.1, "ssl_items": "batch",
                "item_pretrain_epochs": 2, "epochs": 22})  # fmt: skip
    return {"two_tower_fp32": fp32, "two_tower_ssl": ssl}


def seed_study(seed: int, quick: bool) -> dict:
    """Every grid variant of the library and of the peers with ``seed`` (in a fresh process).

    Returns:
        ``model -> variant label -> {"val", "test", ...}``.

    """
    import torch

    from benchmarks._retrieval_peers import GRIDS, PEERS, RetrievalSplit, evaluate, peer_scorer
    from benchmarks._retrieval_towers import TowerConfig, tower_runs
    from ssl_rec.data.sources.movielens_retrieval import MovieLensRetrievalDataModule

    torch.set_num_threads(1)
    dm = MovieLensRetrievalDataModule()
    split = RetrievalSplit.of(dm)
    out: dict[str, dict] = {}
    for model, configs in grids(quick).items():
        out[model] = {}
        for kwargs in configs:
            start, cpu = time.time(), time.process_time()
            run = tower_runs(TowerConfig(**kwargs), dm, split, seed)
            out[model][json.dumps(kwargs, sort_keys=True)] = {
                **run,
                "seconds": time.time() - start,
                "cpu_seconds": time.process_time() - cpu,
            }
    for name in PEERS:
        out[name] = {}
        for params in GRIDS[name][:1] if quick else GRIDS[name]:
            start, cpu = time.time(), time.process_time()
            run = evaluate(peer_scorer(name, split, params, seed), split)
            out[name][json.dumps(params, sort_keys=True)] = {
                **run,
                "seconds": time.time() - start,
                "cpu_seconds": time.process_time() - cpu,
            }
    return out


def int8_study(seed: int, kwargs: dict) -> dict:
    """The chosen FP32 variant ``kwargs`` with INT8 tables and a 5% FP32 cache."""
    import torch

    from benchmarks._retrieval_peers import RetrievalSplit
    from benchmarks._retrieval_towers import TowerConfig, tower_runs
    from ssl_rec.data.sources.movielens_retrieval import MovieLensRetrievalDataModule

    torch.set_num_threads(1)
    dm = MovieLensRetrievalDataModule()
    start, cpu = time.time(), time.process_time()
    run = tower_runs(TowerConfig(**kwargs, precision="int8"), dm, RetrievalSplit.of(dm), seed)
    timing = {"seconds": time.time() - start, "cpu_seconds": time.process_time() - cpu}
    return {json.dumps({**kwargs, "precision": "int8"}, sort_keys=True): {**run, **timing}}


def choose(runs: dict[int, dict[str, dict]], metric: str = "recall_at_10") -> str:
    """The variant label of best mean validation ``metric`` over seeds."""
    labels = next(iter(runs.values()))
    return choose_variant({v: {s: runs[s][v]["val"][metric] for s in runs} for v in labels})


def accuracy(seeds: tuple[int, ...], quick: bool) -> dict:
    """The seed studies, the choices on validation and the JSON figures."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1"}  # fmt: skip
    with ThreadPoolExecutor(2) as pool:
        done = pool.map(lambda s: run_in_fresh_process(seed_study, s, quick, env=env), seeds)
        studies = dict(zip(seeds, done, strict=True))
        per_model = {m: {s: studies[s][m] for s in seeds} for m in studies[seeds[0]]}
        fp32 = choose(per_model["two_tower_fp32"])
        int8 = dict(zip(seeds, pool.map(
            lambda s: run_in_fresh_process(int8_study, s, json.loads(fp32), env=env), seeds),
            strict=True))  # fmt: skip
    per_model["two_tower_int8_cache"] = int8
    # The item-side SSL exists for the tail: its weight is chosen on validation tail recall.
    chosen = {
        m: choose(runs, CHOICE_METRIC.get(m, "recall_at_10")) for m, runs in per_model.items()
    }
    test = {m: {s: per_model[m][s][chosen[m]]["test"] for s in seeds} for m in per_model}
    from benchmarks._retrieval_peers import PEERS

    results: dict = {
        metric: {m: mean_std([test[m][s][metric] for s in seeds]) for m in per_model}
        for metric in METRICS
    }
    results["peers"] = list(PEERS)
    tail = {m: {s: test[m][s]["tail_recall_at_10"] for s in seeds} for m in LIBRARY}
    recall = {m: {s: test[m][s]["recall_at_10"] for s in seeds} for m in LIBRARY}
    results["ssl_tail_gain"] = seed_diffs(tail["two_tower_ssl"], tail["two_tower_fp32"])
    results["int8_recall_gap"] = seed_diffs(
        recall["two_tower_int8_cache"], recall["two_tower_fp32"]
    )
    best_peer = max(PEERS, key=lambda p: results["recall_at_10"][p]["mean"])
    results["best_peer"] = best_peer
    results["chosen"] = chosen
    results["runs"] = {m: {str(s): per_model[m][s] for s in seeds} for m in per_model}
    results["cpu_seconds_per_seed"] = {  # the seed's runs in its two processes
        str(s): sum(r.get("cpu_seconds", 0.0) for m in per_model for r in per_model[m][s].values())
        for s in seeds
    }
    return results


def serving(n_items: int, dim: int, queries: int, k: int = 100, seed: int = 0) -> dict:
    """Top-``k`` over ``n_items`` clustered unit vectors with the default index, one thread.

    Returns:
        ``factory``, ``search_params``, ``build_seconds``, ``queries_per_s`` (batches of
        1,024, best of three passes), ``single_queries_per_s`` and ``p50_ms``/``p99_ms`` (one
        query at a time), ``recall_at_100`` against exact inner-product search, the sizes.

    """
    import faiss

    from ssl_rec.evaluation.faiss_index import build_index, default_search_params, resolve_factory

    faiss.omp_set_num_threads(1)
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((1000, dim)).astype(np.float32)

    def draw(n: int) -> np.ndarray:
        x = centres[rng.integers(0, len(centres), n)] + 0.5 * rng.standard_normal((n, dim))
        x = x.astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    items, q = draw(n_items), draw(queries)
    factory = resolve_factory("auto", n_items, dim)
    start = time.perf_counter()
    index = build_index(items, factory, "ip")
    build = time.perf_counter() - start
    rounds = []
    for _ in range(3):  # the best of three passes: other processes share the cores
        start = time.perf_counter()
        for lo in range(0, queries, 1024):
            index.search(q[lo : lo + 1024], k)
        rounds.append(time.perf_counter() - start)
    batched = queries / min(rounds)
    _, found = index.search(q, k)
    single = []
    for row in q[: min(queries, 2000)]:
        t = time.perf_counter()
        index.search(row[None], k)
        single.append(time.perf_counter() - t)
    exact = faiss.IndexFlatIP(dim)
    exact.add(items)
    _, truth = exact.search(q, k)
    recall = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(found, truth, strict=True)]))
    return {"n_items": n_items, "dim": dim, "queries": queries, "k": k, "factory": factory,
            "search_params": default_search_params(index), "build_seconds": build,
            "queries_per_s": batched, "single_queries_per_s": len(single) / sum(single),
            "p50_ms": 1e3 * float(np.percentile(single, 50)),
            "p99_ms": 1e3 * float(np.percentile(single, 99)), "recall_at_100": recall,
            "threads": 1}  # fmt: skip


def plot(results: dict):
    """Test recall@10 and tail recall@10 of every model (mean ± std over seeds)."""
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4))
    if "recall_at_10" not in results:  # a serving-only run
        axes[0].bar(["p50", "p99"], [results["serving"]["p50_ms"], results["serving"]["p99_ms"]])
        axes[0].set_ylabel("ms per top-100 query")
        axes[1].axis("off")
        return fig
    for ax, metric in zip(axes, ("recall_at_10", "tail_recall_at_10"), strict=True):
        models = list(results[metric])
        ax.bar(models, [results[metric][m]["mean"] for m in models],
               yerr=[results[metric][m]["std"] for m in models])  # fmt: skip
        ax.set_title(f"MovieLens-100k test {metric}")
        ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    return fig


def main() -> None:
    """Parse arguments, run the study (and the serving figure), write JSON + PNG."""
    parser = benchmark_parser(__doc__.splitlines()[0], seeds=True)
    parser.add_argument("--serving", action="store_true", help="add the 1M-item serving figure")
    parser.add_argument("--serving-only", action="store_true", help="only the serving figure")
    args = parser.parse_args()
    record = Recording(__file__)
    start = time.time()
    results: dict = {}
    seeds = chosen_seeds(args, SEEDS)
    if not args.serving_only:
        results = accuracy(seeds, args.quick)
    if args.serving or args.serving_only:
        results["serving"] = (serving(50_000, 32, 2048) if args.quick
                              else serving(1_000_000, 32, 10_000))  # fmt: skip
    results["config"] = {"seeds": list(seeds), "quick": args.quick, "seconds": time.time() - start,
                         "grids": grids(args.quick), "cores": os.cpu_count()}  # fmt: skip
    record.write(args.json, results, plot, threads=1)
    summary = {k: v for k, v in results.items() if k not in ("runs", "config")}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
