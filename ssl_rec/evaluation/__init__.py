"""Evaluation: embedding export with FAISS indexes, loading/querying, probes and metrics."""

from ssl_rec.evaluation.embedding_index import EmbeddingIndex
from ssl_rec.evaluation.evaluate import EvalConfig, LatentTruth, evaluate_embeddings
from ssl_rec.evaluation.export import IndexConfig, entity_vectors, export_embeddings
from ssl_rec.evaluation.faiss_index import build_index, default_search_params, resolve_factory
from ssl_rec.evaluation.item_catalogue import ItemCatalogue
from ssl_rec.evaluation.knn_probe import knn_predict, knn_probe
from ssl_rec.evaluation.latent_agreement import frequent_ids, latent_neighbor_recall
from ssl_rec.evaluation.linear_probe import linear_probe
from ssl_rec.evaluation.manifest import FORMAT_VERSION, Manifest, VectorSet
from ssl_rec.evaluation.representation_health import effective_rank, representation_health
from ssl_rec.evaluation.representations import RepresentationSet, compute_representations
from ssl_rec.evaluation.retrieval_export import export_retrieval
from ssl_rec.evaluation.retrieval_metrics import retrieval_metrics, tail_items, top_k_unseen
from ssl_rec.evaluation.retriever import Retriever

__all__ = [
    "FORMAT_VERSION",
    "EmbeddingIndex",
    "EvalConfig",
    "IndexConfig",
    "ItemCatalogue",
    "LatentTruth",
    "Manifest",
    "RepresentationSet",
    "Retriever",
    "VectorSet",
    "build_index",
    "compute_representations",
    "default_search_params",
    "effective_rank",
    "entity_vectors",
    "evaluate_embeddings",
    "export_retrieval",
    "export_embeddings",
    "frequent_ids",
    "knn_predict",
    "knn_probe",
    "latent_neighbor_recall",
    "linear_probe",
    "representation_health",
    "resolve_factory",
    "retrieval_metrics",
    "tail_items",
    "top_k_unseen",
]
