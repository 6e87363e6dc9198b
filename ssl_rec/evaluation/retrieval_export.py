"""Export of a trained two-tower model for serving: a query tower, an item index, vocabularies.

The directory (written atomically) holds::

    manifest.json      format, schema, query columns, sizes, index, dense scaling, checksums
    query_tower.pt     the query tower's state dict (``torch.load(weights_only=True)``)
    items.faiss        FAISS inner-product index of the catalogue's unit vectors (id i = row i)
    item_ids.npy       int64[N] item id of each row
    item_keys.npy      str[N] raw key of each item (its value in the user's table)
    vocabulary.arrow   raw value -> id of every categorical column (when the model has them)

The index comes from the index factory (``auto``: exact ``Flat`` up to 20k items, else
``IVF{nlist},PQ{H/2}x4fs,RFlat``, see :mod:`~ssl_rec.evaluation.faiss_index`). The manifest
is written last and records the CRC-32 of every other file, checked when
:class:`~ssl_rec.evaluation.retriever.Retriever` loads them. Nothing in it names a class: the
query tower is rebuilt as a ``Backbone`` with a ``TowerEncoder`` of the recorded sizes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ssl_rec._checks import check_known_keys
from ssl_rec._io import atomic_directory, atomic_write_json, directory_checksums
from ssl_rec.evaluation.faiss_index import (
    build_index_or_exact,
    default_search_params,
    resolve_factory,
    write_faiss_index,
)
from ssl_rec.models.two_tower import TowerEncoder, TwoTowerModel
from ssl_rec.types import Batch
from ssl_rec.vocab import VOCABULARY_FILENAME, Vocabularies

RETRIEVAL_FORMAT, RETRIEVAL_VERSION = "ssl-rec-retrieval", 2
MANIFEST, QUERY_TOWER, INDEX, IDS, KEYS = (
    "manifest.json", "query_tower.pt", "items.faiss", "item_ids.npy", "item_keys.npy"
)  # fmt: skip
_TYPES = {"schema": dict, "query_fields": list, "item_id_field": str, "embedding_dim": int,
          "hidden": list, "output_dim": int, "n_items": int, "index": dict,
          "dense_scaling": dict, "checksums": dict}  # fmt: skip


@torch.no_grad()
def export_retrieval(
    towers: TwoTowerModel,
    items: Batch,
    item_ids: torch.Tensor,
    directory: str | os.PathLike[str],
    overwrite: bool = False,
    *,
    vocabulary: Vocabularies | None = None,
    dense_scaling: Mapping[str, tuple[float, float]] | None = None,
    index: str = "auto",
    train_size: int | None = 100_000,
) -> Path:
    """Write the query tower, the catalogue's FAISS index and the vocabularies to ``directory``.

    Args:
        towers: the trained two towers; the query encoder must be a ``TowerEncoder``.
        items: the catalogue, a batch of the item tower's columns (``N`` rows).
        item_ids: ``int64[N]`` item id of each catalogue row.
        directory: where to write (must not exist unless ``overwrite``).
        overwrite: replace an existing directory.
        vocabulary: raw value -> id of every categorical column of ``towers.schema``; without
            it the served model takes ids and returns item ids as keys.
        dense_scaling: ``column -> (mean, std)`` the numeric columns were standardised with
            (raw ``x`` is served as ``(x - mean) / std``); absent columns are taken as given.
        index: FAISS factory string or ``auto``.
        train_size: vectors sampled to train an approximate index.

    Returns:
        ``directory`` as a ``Path``.

    """
    encoder = towers.query_tower.encoder
    if not isinstance(encoder, TowerEncoder):
        raise ValueError(
            f"export_retrieval: the query encoder is a {type(encoder).__name__}; only a "
            "TowerEncoder is rebuilt from plain sizes"
        )
    if item_ids.shape != (items.batch_size,):
        raise ValueError(f"export_retrieval: item_ids must be [{items.batch_size}]")
    if vocabulary is not None:
        vocabulary.check_schema(towers.schema, "export_retrieval: the vocabulary")
    scaling = _scaling(dense_scaling or {}, towers)
    was_training = towers.training
    towers.eval()
    try:
        vectors = np.ascontiguousarray(towers.encode_items(items).float().cpu().numpy())
    finally:
        towers.train(was_training)
    ids = item_ids.long().cpu().numpy()
    keys = item_keys(vocabulary, towers.item_id_field, ids)
    factory = resolve_factory(index, *vectors.shape)
    built_index, built, note = build_index_or_exact(vectors, factory, "ip", train_size)
    query = towers.query_schema
    manifest: dict[str, Any] = {
        "format": RETRIEVAL_FORMAT,
        "version": RETRIEVAL_VERSION,
        "schema": towers.schema.to_dict(),
        "query_fields": [*query.field_names, *query.dense],
        "item_id_field": towers.item_id_field,
        "embedding_dim": int(towers.query_tower.dims.embedding_dim),
        "hidden": list(encoder.hidden),
        "output_dim": int(encoder.output_dim),
        "n_items": int(items.batch_size),
        "metric": "ip",
        "index": {
            "requested": index,
            "factory": built,
            "search_params": default_search_params(built_index),
            **({"fallback": note} if note else {}),
        },  # fmt: skip
        "dense_scaling": scaling,
        "vocabulary": VOCABULARY_FILENAME if vocabulary is not None else None,
    }
    with atomic_directory(directory, overwrite=overwrite) as tmp:
        torch.save(towers.query_tower.state_dict(), tmp / QUERY_TOWER)
        write_faiss_index(built_index, tmp / INDEX)
        np.save(tmp / IDS, ids)
        np.save(tmp / KEYS, keys, allow_pickle=False)
        if vocabulary is not None:
            vocabulary.save(tmp / VOCABULARY_FILENAME)
        manifest["checksums"] = directory_checksums(tmp, [MANIFEST])
        atomic_write_json(tmp / MANIFEST, manifest)
    return Path(directory)


def item_keys(vocabulary: Vocabularies | None, field: str, ids: np.ndarray) -> np.ndarray:
    """``str[N]`` raw key of each item id (the id itself as text without a vocabulary)."""
    if vocabulary is None:
        return ids.astype(str)
    values = np.asarray(vocabulary.id_values(field).to_pylist(), dtype=str)
    return values[ids]


def _scaling(
    scaling: Mapping[str, tuple[float, float]], towers: TwoTowerModel
) -> dict[str, list[float]]:
    check_known_keys("export_retrieval", "dense_scaling", scaling, towers.schema.dense, "columns")
    out = {}
    for name, (mean, std) in scaling.items():
        if not (np.isfinite(mean) and np.isfinite(std) and std > 0):
            raise ValueError(f"export_retrieval: dense_scaling[{name!r}] = {(mean, std)}")
        out[name] = [float(mean), float(std)]
    return out


def checked_manifest(manifest: Any, where: Path) -> dict[str, Any]:
    """The manifest if it is this format's, with each key of the right type.

    Raises:
        ValueError: naming ``where`` and what is wrong.

    """
    if not isinstance(manifest, dict) or manifest.get("format") != RETRIEVAL_FORMAT:
        raise ValueError(f"{where}: not a retrieval export (format is not {RETRIEVAL_FORMAT!r})")
    if manifest.get("version") != RETRIEVAL_VERSION:
        raise ValueError(
            f"{where}: version {manifest.get('version')!r}, this ssl-rec reads "
            f"{RETRIEVAL_VERSION} (export the model again)"
        )
    wrong = [k for k, t in _TYPES.items() if not isinstance(manifest.get(k), t)]
    if wrong:
        raise ValueError(f"{where}: missing or mistyped keys {wrong}")
    vocabulary = manifest.get("vocabulary")
    if vocabulary not in (None, VOCABULARY_FILENAME):
        raise ValueError(f"{where}: vocabulary must be {VOCABULARY_FILENAME!r} or null")
    expected = {QUERY_TOWER, INDEX, IDS, KEYS, *([vocabulary] if vocabulary else [])}
    if set(manifest["checksums"]) != expected:
        raise ValueError(
            f"{where}: checksums list {sorted(manifest['checksums'])}, expected {sorted(expected)}"
        )
    return manifest
