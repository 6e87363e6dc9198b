"""Export of a trained two-tower model for serving, and :class:`Retriever` to query it.

The directory holds::

    manifest.json       format, schema, query columns, embedding_dim, the query encoder's sizes
    query_tower.pt      the query tower's state dict (``torch.load(weights_only=True)``)
    item_vectors.npy    float32[N, H] unit vectors of the catalogue
    item_ids.npy        int64[N] item id of each vector

Nothing in it names a class: the query tower is rebuilt as a ``Backbone`` with a
:class:`~ssl_rec.models.TowerEncoder` of the recorded sizes, its tables in FP32 whatever
precision they were trained in. Search is exact inner product over the item vectors.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ssl_rec._io import atomic_directory, atomic_write_json
from ssl_rec.models.backbone import Backbone
from ssl_rec.models.two_tower import TowerEncoder, TwoTowerModel, tower_schema
from ssl_rec.schema import FeatureSchema
from ssl_rec.types import Batch

RETRIEVAL_FORMAT, RETRIEVAL_VERSION = "ssl-rec-retrieval", 1
MANIFEST, QUERY_TOWER, VECTORS, IDS = (
    "manifest.json", "query_tower.pt", "item_vectors.npy", "item_ids.npy"
)  # fmt: skip


@torch.no_grad()
def export_retrieval(
    towers: TwoTowerModel,
    items: Batch,
    item_ids: torch.Tensor,
    directory: str | os.PathLike[str],
    overwrite: bool = False,
) -> Path:
    """Write the query tower and the catalogue's item vectors to ``directory`` (atomically).

    Args:
        towers: the trained two towers; the query encoder must be a ``TowerEncoder``.
        items: the catalogue, a batch of the item tower's columns (``N`` rows).
        item_ids: ``int64[N]`` item id of each catalogue row.
        directory: where to write (must not exist unless ``overwrite``).
        overwrite: replace an existing directory.

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
    was_training = towers.training
    towers.eval()
    try:
        vectors = towers.encode_items(items).float().cpu().numpy()
    finally:
        towers.train(was_training)
    query = towers.query_schema
    manifest = {
        "format": RETRIEVAL_FORMAT,
        "version": RETRIEVAL_VERSION,
        "schema": towers.schema.to_dict(),
        "query_fields": [*query.field_names, *query.dense],
        "embedding_dim": int(towers.query_tower.dims.embedding_dim),
        "hidden": list(encoder.hidden),
        "output_dim": int(encoder.output_dim),
        "n_items": int(items.batch_size),
    }
    with atomic_directory(directory, overwrite=overwrite) as tmp:
        torch.save(towers.query_tower.state_dict(), tmp / QUERY_TOWER)
        np.save(tmp / VECTORS, vectors)
        np.save(tmp / IDS, item_ids.long().cpu().numpy())
        atomic_write_json(tmp / MANIFEST, manifest)
    return Path(directory)


class Retriever:
    """A query tower and the catalogue's item vectors: ``topk(rows, k)`` items per row.

    Build it with :meth:`load`. ``rows`` are batches with every column of :attr:`schema`
    (the item columns are ignored); only the query tower runs.
    """

    def __init__(
        self, schema: FeatureSchema, query_tower: Backbone, vectors: torch.Tensor,
        item_ids: torch.Tensor,
    ) -> None:  # fmt: skip
        self.schema, self.query_tower = schema, query_tower.eval()
        self.vectors, self.item_ids = vectors, item_ids
        names = query_tower.schema
        self._sparse = torch.tensor([schema.field_index(n) for n in names.field_names])
        self._dense = torch.tensor([list(schema.dense).index(n) for n in names.dense],
                                   dtype=torch.long)  # fmt: skip

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Retriever:
        """Open an :func:`export_retrieval` directory.

        Raises:
            ValueError: naming the file when it is not such a directory or is inconsistent.

        """
        root = Path(directory)
        where = root / MANIFEST
        try:
            manifest = json.loads(where.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{where}: not a retrieval export ({e})") from e
        manifest = _checked_manifest(manifest, where)
        schema = FeatureSchema.from_dict(manifest["schema"])
        query = tower_schema(schema, manifest["query_fields"], "query")
        encoder = partial(TowerEncoder, hidden=manifest["hidden"],
                          output_dim=manifest["output_dim"])  # fmt: skip
        tower = Backbone(query, manifest["embedding_dim"], encoder=encoder)
        state = torch.load(root / QUERY_TOWER, map_location="cpu", weights_only=True)
        tower.load_weights(state, str(root / QUERY_TOWER))
        vectors = torch.from_numpy(np.load(root / VECTORS, allow_pickle=False)).float()
        ids = torch.from_numpy(np.load(root / IDS, allow_pickle=False)).long()
        expected = (manifest["n_items"], manifest["output_dim"])
        if tuple(vectors.shape) != expected or tuple(ids.shape) != expected[:1]:
            raise ValueError(
                f"{root}: item vectors {tuple(vectors.shape)} and ids {tuple(ids.shape)} do "
                f"not match the manifest's {expected}"
            )
        return cls(schema, tower, vectors, ids)

    @torch.no_grad()
    def topk(
        self, rows: Batch, k: int, exclude: Sequence[Sequence[int] | torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scores float32[B, k], item_ids int64[B, k])``, best first, by inner product.

        Args:
            rows: ``B`` full-schema rows (only the query columns are read).
            k: items per row, ``1..N``.
            exclude: per row, item ids never to return (its history); ids outside the
                catalogue are ignored. A row left with fewer than ``k`` items ends with
                item id ``-1`` and score ``-inf``.

        """
        if not 1 <= k <= len(self.item_ids):
            raise ValueError(f"Retriever.topk: k={k} must be in 1..{len(self.item_ids)}")
        query = Batch(rows.dense[:, self._dense], rows.sparse[:, self._sparse])
        scores = self.query_tower(query).pooled @ self.vectors.T
        if exclude is not None:
            if len(exclude) != len(scores):
                raise ValueError(
                    f"Retriever.topk: exclude has {len(exclude)} rows, the batch {len(scores)}"
                )
            for row, seen in enumerate(exclude):
                seen = torch.as_tensor(seen, dtype=torch.long).reshape(-1)
                scores[row, torch.isin(self.item_ids, seen)] = -math.inf
        top = torch.topk(scores, k, dim=1)
        ids = self.item_ids[top.indices]
        return top.values, ids.masked_fill(torch.isneginf(top.values), -1)


def _checked_manifest(manifest: Any, where: Path) -> Mapping[str, Any]:
    """The manifest if it is this format's, with each key of the right type."""
    types = {"schema": dict, "query_fields": list, "embedding_dim": int, "hidden": list,
             "output_dim": int, "n_items": int}  # fmt: skip
    if not isinstance(manifest, dict) or manifest.get("format") != RETRIEVAL_FORMAT:
        raise ValueError(f"{where}: not a retrieval export (format is not {RETRIEVAL_FORMAT!r})")
    if manifest.get("version") != RETRIEVAL_VERSION:
        raise ValueError(f"{where}: version {manifest.get('version')!r}, expected 1")
    wrong = [k for k, t in types.items() if not isinstance(manifest.get(k), t)]
    if wrong:
        raise ValueError(f"{where}: missing or mistyped keys {wrong}")
    return manifest
