"""Retrieval benchmark: ANN recall of the default index, 1M-vector export time, and
agreement of learned entity neighbours with the synthetic click model's true latents.
The trained models are built from the shipped configs (`configs/ctr`, `configs/pretrain`).

    python benchmarks/retrieval.py [--quick] --json benchmarks/results/retrieval.json

Writes the JSON and a .png plot beside it (atomically) and prints a table.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # `python benchmarks/retrieval.py`: import the package from the root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import faiss
import numpy as np
import torch

from benchmarks._harness import Figure, Recording, benchmark_parser, pyplot
from ssl_rec.cli import instantiate
from ssl_rec.evaluation import (
    IndexConfig,
    RepresentationSet,
    build_index,
    export_embeddings,
    resolve_factory,
)
from ssl_rec.evaluation.evaluate import latent_neighbors
from ssl_rec.metrics import ann_recall_at_k
from ssl_rec.models import Backbone
from ssl_rec.schema import CategoricalField, FeatureSchema

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def clustered(n: int, dim: int, seed: int = 0, clusters: int = 1000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((clusters, dim)).astype(np.float32)
    x = centers[rng.integers(0, clusters, n)] + 0.3 * rng.standard_normal((n, dim)).astype(
        np.float32
    )
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def ann_recall(n: int, dim: int = 64, queries: int = 2000) -> dict:
    x = clustered(n, dim)
    factory = resolve_factory("auto", n, dim)
    t = time.perf_counter()
    index = build_index(x, factory, "ip")
    build_s = time.perf_counter() - t
    rng = np.random.default_rng(1)
    q = x[rng.choice(n, queries, replace=False)] + 0.05 * rng.standard_normal(
        (queries, dim)
    ).astype(np.float32)
    exact = faiss.IndexFlatIP(dim)
    exact.add(x)
    t = time.perf_counter()
    _, approx_ids = index.search(q, 10)
    qps = queries / (time.perf_counter() - t)
    _, exact_ids = exact.search(q, 10)
    return {
        "ann_recall_at_10": ann_recall_at_k(approx_ids, exact_ids, 10),
        "index": factory,
        "n": n,
        "build_seconds": build_s,
        "queries_per_second": qps,
    }


def export_seconds(n: int, dim: int = 64) -> dict:
    reps = RepresentationSet(clustered(n, dim, seed=2), np.arange(n), None)
    # Only representations are exported, so a placeholder schema and its untrained backbone
    # suffice (export_embeddings asks the backbone for vocabularies, built before the clock).
    schema = FeatureSchema(("I1",), (CategoricalField("C1", 2),), "label")
    backbone = Backbone(schema)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        export_embeddings(
            backbone,
            schema,
            Path(tmp) / "e",
            [],
            representations={"bench": reps},
            config=IndexConfig("auto"),
            progress=False,
        )
        seconds = time.perf_counter() - t
    return {"export_seconds": seconds, "n": n, "index": resolve_factory("auto", n, dim)}


def _build(config: str, root: Path, n_train: int, *overrides: str):  # noqa: ANN202
    return instantiate([
        "--config", str(CONFIGS / config), "--trainer.logger=false", "--trainer.callbacks=null",
        "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
        "--trainer.limit_val_batches=0", f"--trainer.default_root_dir={root}",
        f"--data.init_args.n_train={n_train}", "--data.init_args.n_val=2000",
        "--data.init_args.n_test=2000", "--data.init_args.batch_size=1024",
        f"--data.init_args.cache_dir={root / 'cache'}", *overrides,
    ])  # fmt: skip


def latent_recall(quick: bool, root: Path) -> dict:
    """Latent-neighbour recall of entity embeddings: random init, pretrained, CTR on 2% labels."""
    n_train = 50_000 if quick else 400_000
    torch.manual_seed(0)
    random_init = _build("ctr/synthetic.yaml", root, n_train)
    pretrained = _build("pretrain/mfp.yaml", root, n_train, "--trainer.max_epochs=1")
    pretrained.trainer.fit(pretrained.model, datamodule=pretrained.datamodule)
    scratch = _build("ctr/synthetic.yaml", root, n_train, "--trainer.max_epochs=3",
                     "--data.init_args.label_fraction=0.02")  # fmt: skip
    scratch.trainer.fit(scratch.model, datamodule=scratch.datamodule)
    data = random_init.datamodule
    truth = data.click_model().latent_truth
    models = {"random_init": random_init.model, "pretrained": pretrained.model,
              "scratch_ctr": scratch.model}  # fmt: skip
    return {
        name: latent_neighbors(m, data.train_dataloader(), 50_000, truth)["mean"]
        for name, m in models.items()
    }


def plot(results: dict) -> Figure:
    """Latent-neighbour recall per model; ANN recall and the export time."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    lat = results.get("latent_neighbor_recall_at_10", {})
    axes[0].bar(
        list(lat), list(lat.values()), color=["tab:green", "tab:gray", "tab:orange"][: len(lat)]
    )
    axes[0].set_title("latent-neighbour recall@10")
    axes[1].bar(["ann recall@10"], [results["ann_recall_at_10"]])
    axes[1].set_ylim(0, 1)
    axes[1].set_title(f"export 1M x 64: {results['export_seconds_1m']:.1f} s")
    fig.tight_layout()
    return fig


def main() -> None:
    """Parse arguments, measure, write JSON + PNG, print a table."""
    parser = benchmark_parser(__doc__.splitlines()[0])
    parser.add_argument("--skip-latent", action="store_true", help="skip the training part")
    args = parser.parse_args()
    record = Recording(__file__)
    faiss.omp_set_num_threads(2)
    ann = ann_recall(100_000)
    exp = export_seconds(1_000_000)
    results = {
        "ann_recall_at_10": ann["ann_recall_at_10"],
        "export_seconds_1m": exp["export_seconds"],
        "details": {"ann": ann, "export": exp},
        "quick": args.quick,
    }
    if not args.skip_latent:
        with tempfile.TemporaryDirectory() as tmp:
            results["latent_neighbor_recall_at_10"] = latent_recall(args.quick, Path(tmp))
    record.write(args.json, results, plot)
    rows = [
        ("ann_recall_at_10", ann["ann_recall_at_10"]),
        ("export_seconds_1m", exp["export_seconds"]),
    ]
    rows += [
        (f"latent_neighbor_recall_at_10/{k}", v)
        for k, v in results.get("latent_neighbor_recall_at_10", {}).items()
    ]
    for name, value in rows:
        print(f"{name:<42} {value:.4f}")


if __name__ == "__main__":
    main()
