"""Evaluate frozen representations: kNN and linear probes, geometry, retrieval, true latents.

Retrieval uses the DLRM view of a row: its context is the mean embedding of every field
but the item field, and items are scored by inner product with it, which is the pairwise
interaction a DLRM (dot) encoder computes. Queries are the clicked test rows; each one's
positive is its own item id; ranks come from exact search and from the approximate index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np
import torch
from torch import nn

from ssl_rec._checks import check_at_least
from ssl_rec.evaluation.export import entity_vectors
from ssl_rec.evaluation.faiss_index import METRICS, build_index_or_exact, resolve_factory
from ssl_rec.evaluation.knn_probe import knn_probe
from ssl_rec.evaluation.latent_agreement import frequent_ids, latent_neighbor_recall
from ssl_rec.evaluation.linear_probe import linear_probe
from ssl_rec.evaluation.representations import backbone_of, compute_representations
from ssl_rec.metrics import alignment, ann_recall_at_k, ndcg_at_k, recall_at_k, uniformity
from ssl_rec.types import Batch

# field name -> (true latent of every id float32[card, k], latent cluster int64[card]).
LatentTruth = Callable[[str], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class EvalConfig:
    """What :func:`evaluate_embeddings` measures and on how many rows.

    Args:
        train_rows: training rows for the probes' neighbour bank / fit and id counts.
        test_rows: test rows probed and used as retrieval queries.
        knn_k: neighbours of the kNN probe.
        ks: cut-offs of recall@K and NDCG@K.
        index: FAISS factory string (or ``auto``) of the approximate retrieval index.
        item_field: field whose ids are retrieved; ``None``: the largest-cardinality field.
        mask_prob: per-field masking probability of the positive view for alignment.
        seed: seed of the masking.

    """

    train_rows: int = 20_000
    test_rows: int = 5_000
    knn_k: int = 50
    ks: tuple[int, ...] = (10, 50)
    index: str = "auto"
    item_field: str | None = None
    mask_prob: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("train_rows", "test_rows", "knn_k"):
            check_at_least("EvalConfig", key, getattr(self, key))
        if not self.ks or min(self.ks) < 1:
            raise ValueError(f"EvalConfig.ks must be positive cut-offs, got {self.ks}")
        if not 0.0 < self.mask_prob < 1.0:
            raise ValueError(f"EvalConfig.mask_prob must be in (0, 1), got {self.mask_prob}")


def evaluate_embeddings(
    model: nn.Module,
    train: Iterable[Batch],
    test: Iterable[Batch],
    config: EvalConfig | None = None,
    latent_truth: LatentTruth | None = None,
) -> dict[str, Any]:
    """All representation metrics of ``model`` on a train and a test loader.

    Args:
        model: a Backbone or a module with ``.backbone`` (CTRModule, PretrainModule).
        train: labeled training batches (e.g. ``datamodule.train_dataloader()``).
        test: labeled test batches.
        config: sizes and options (:class:`EvalConfig`).
        latent_truth: the true latents of the data's ids when known (synthetic data:
            ``SyntheticClickModel.latent_truth``); adds ``latent_neighbors``.

    Returns:
        Nested dict: ``knn_probe`` and ``linear_probe`` (``auc``, ``logloss``),
        ``geometry`` (``alignment``, ``uniformity``), ``retrieval`` (recall/NDCG@K exact and
        approximate, ``ann_recall_at_k``), and ``latent_neighbors`` given ``latent_truth``.

    """
    config = config or EvalConfig()
    backbone = backbone_of(model)
    tr = compute_representations(backbone, train, config.train_rows)
    te = compute_representations(backbone, test, config.test_rows)
    results: dict[str, Any] = {"rows": {"train": len(tr), "test": len(te)}}
    if tr.labels is not None and te.labels is not None:
        results["knn_probe"] = knn_probe(tr.vectors, tr.labels, te.vectors, te.labels, config.knn_k)
        results["linear_probe"] = linear_probe(tr.vectors, tr.labels, te.vectors, te.labels)
    else:
        results["probes_skipped"] = "the train or test batches have no labels"
    results["geometry"] = geometry(backbone, test, config)
    results["retrieval"] = retrieval(backbone, test, config)
    if latent_truth is not None:
        results["latent_neighbors"] = latent_neighbors(
            backbone, train, config.train_rows, latent_truth
        )
    return results


@torch.no_grad()
def geometry(backbone: nn.Module, batches: Iterable[Batch], config: EvalConfig) -> dict[str, float]:
    """Alignment (row vs. the row with random fields masked) and uniformity of ``pooled``."""
    gen = torch.Generator().manual_seed(config.seed)
    views, positives = [], []
    for batch in _take(batches, config.test_rows):
        mask = torch.rand(batch.sparse.shape, generator=gen) < config.mask_prob
        views.append(backbone(batch).pooled)
        positives.append(backbone(batch, field_mask=mask).pooled)
    x, y = torch.cat(views)[: config.test_rows], torch.cat(positives)[: config.test_rows]
    return {"alignment": float(alignment(x, y)), "uniformity": float(uniformity(x))}


@torch.no_grad()
def retrieval(backbone: nn.Module, batches: Iterable[Batch], config: EvalConfig) -> dict[str, Any]:
    """Recall@K / NDCG@K of the clicked rows' items from their context (module docstring)."""
    schema = backbone.schema
    field = config.item_field or schema.field_names[int(np.argmax(schema.cardinalities))]
    f = schema.field_index(field)
    queries, positives = [], []
    for batch in _take(batches, config.test_rows):
        keep = (batch.sparse[:, f] != 0) & (batch.label > 0.5 if batch.label is not None else True)
        emb = backbone(batch).field_emb[keep]
        others = [i for i in range(emb.shape[1]) if i != f]
        queries.append(emb[:, others].mean(1))
        positives.append(batch.sparse[keep, f])
    q = torch.cat(queries).float().numpy()
    pos = torch.cat(positives).numpy()
    items = entity_vectors(backbone, field, schema.field(field).cardinality)
    items[0] = 0.0  # the missing id is never a retrievable item
    kmax = min(max(config.ks), len(items))
    exact = faiss.IndexFlat(items.shape[1], METRICS["ip"])
    exact.add(items)
    _, exact_ids = exact.search(q, kmax)
    index, factory, _ = build_index_or_exact(
        items, resolve_factory(config.index, len(items), items.shape[1]), "ip"
    )
    _, approx_ids = index.search(q, kmax)
    out: dict[str, Any] = {"item_field": field, "queries": len(q), "index": factory}
    for k in (k for k in config.ks if k <= kmax):
        out[f"recall@{k}"] = recall_at_k(exact_ids, pos, k)
        out[f"ndcg@{k}"] = ndcg_at_k(exact_ids, pos, k)
        out[f"approx_recall@{k}"] = recall_at_k(approx_ids, pos, k)
        out[f"approx_ndcg@{k}"] = ndcg_at_k(approx_ids, pos, k)
        out[f"ann_recall@{k}"] = ann_recall_at_k(approx_ids, exact_ids, k)
    return out


def latent_neighbors(
    model: nn.Module,
    train: Iterable[Batch],
    rows: int,
    latent_truth: LatentTruth,
    k: int = 10,
    top: int = 1000,
) -> dict[str, float]:
    """Per-field :func:`latent_neighbor_recall` among frequent training ids, and the mean.

    Fields with fewer than ``10 k`` frequent ids are skipped (with few candidates any
    embedding scores high).
    """
    backbone = backbone_of(model)
    schema = backbone.schema
    sparse = np.concatenate([b.sparse.numpy() for b in _take(train, rows)])[:rows]
    out: dict[str, float] = {}
    for f, name in enumerate(schema.field_names):
        ids = frequent_ids(sparse, f, top=top)
        if len(ids) < 10 * k:
            continue
        learned = entity_vectors(backbone, name, schema.field(name).cardinality)
        latents, clusters = latent_truth(name)
        out[name] = latent_neighbor_recall(learned, latents, ids, k, clusters)
    out["mean"] = float(np.mean(list(out.values()))) if out else float("nan")
    return out


def _take(batches: Iterable[Batch], rows: int) -> Iterable[Batch]:
    seen = 0
    for batch in batches:
        yield batch
        seen += batch.batch_size
        if seen >= rows:
            return
