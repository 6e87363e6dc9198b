"""Retrieval benchmark: ANN recall of the default index, 1M-vector export time, and
agreement of learned entity neighbours with the synthetic generator's true latents.

    python benchmarks/retrieval.py [--quick] --json benchmarks/results/retrieval.json

Writes the JSON and a .png plot beside it (atomically) and prints a table.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from functools import partial
from pathlib import Path

import _isolate  # noqa: F401  (must precede torch: see _isolate.py)
import faiss
import numpy as np
import pytorch_lightning as pl
import torch
from _figures import save_figure

from ssl_rec._io import atomic_write_json
from ssl_rec.data import (
    CategoricalField,
    FeatureSchema,
    SyntheticConfig,
    SyntheticCTRDataModule,
)
from ssl_rec.evaluation import (
    IndexConfig,
    RepresentationSet,
    ann_recall_at_k,
    build_index,
    export_embeddings,
    resolve_factory,
)
from ssl_rec.evaluation.evaluate import latent_neighbors
from ssl_rec.models import Backbone


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
    # Only representations are exported, so a placeholder schema and module suffice.
    schema = FeatureSchema(("I1",), (CategoricalField("C1", 2),), "label")
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        export_embeddings(
            torch.nn.Module(),
            schema,
            Path(tmp) / "e",
            [],
            representations={"bench": reps},
            config=IndexConfig("auto"),
            progress=False,
        )
        seconds = time.perf_counter() - t
    return {"export_seconds": seconds, "n": n, "index": resolve_factory("auto", n, dim)}


def _backbone(schema: dict) -> Backbone:
    from ssl_rec.models import DLRMEncoder

    return Backbone(schema, embedding_dim=16, encoder=partial(DLRMEncoder, bottom=[64], top=[128]))


def latent_recall(quick: bool, root: Path) -> dict:
    from ssl_rec.lightning import CTRModule, PretrainModule
    from ssl_rec.objectives import MaskedFeaturePrediction

    n_train = 50_000 if quick else 400_000
    gen = SyntheticConfig()
    common = {
        "n_train": n_train,
        "n_val": 2000,
        "n_test": 2000,
        "generator": gen,
        "batch_size": 1024,
        "cache_dir": str(root / "cache"),
    }
    unlabeled = SyntheticCTRDataModule(**common, use_labels=False)
    few = SyntheticCTRDataModule(**common, label_fraction=0.02)
    schema = unlabeled.schema.to_dict()
    trainer = partial(
        pl.Trainer,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        limit_val_batches=0,
        default_root_dir=str(root),
    )
    out = {}
    torch.manual_seed(0)
    out["random_init"] = CTRModule(_backbone, schema)
    pre = PretrainModule(_backbone, {"mfp": MaskedFeaturePrediction()}, schema=schema)
    trainer().fit(pre, datamodule=unlabeled)
    out["pretrained"] = pre
    scratch = CTRModule(_backbone, schema)
    trainer(max_epochs=3).fit(scratch, datamodule=few)
    out["scratch_ctr"] = scratch
    bank = SyntheticCTRDataModule(**common)
    return {
        name: latent_neighbors(m, bank.train_dataloader(), 50_000)["mean"]
        for name, m in out.items()
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller training runs")
    parser.add_argument("--json", required=True, help="output JSON path (a .png is written beside)")
    parser.add_argument("--skip-latent", action="store_true", help="skip the training part")
    args = parser.parse_args()
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
    atomic_write_json(args.json, results)
    plot(results, Path(args.json).with_suffix(".png"))
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
