"""Backbone: field embeddings + an interaction encoder, producing a Representation."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ssl_rec.datamodules.schema import FeatureSchema
from ssl_rec.hardware import TableSpec
from ssl_rec.models.dlrm import DLRMEncoder
from ssl_rec.models.field_embedding import FieldEmbedding
from ssl_rec.types import Batch, Representation

EncoderFactory = Callable[[int, int, int], nn.Module]


def as_schema(schema: FeatureSchema | Mapping[str, Any]) -> FeatureSchema:
    """Accept a :class:`FeatureSchema` or its ``to_dict()`` form."""
    if isinstance(schema, FeatureSchema):
        return schema
    if isinstance(schema, Mapping):
        return FeatureSchema.from_dict(dict(schema))
    raise TypeError(f"expected a FeatureSchema or its dict form, got {type(schema).__name__}")


class Backbone(nn.Module):
    """Embeds a batch and encodes it into per-field tokens and one pooled vector.

    Args:
        schema: the data's :class:`FeatureSchema` (or its dict form); gives ``F``,
            cardinalities and ``n_dense``. Linked from the data module by the CLI.
        embedding_dim: ``D``.
        tables: storage/optimizer spec of every embedding table (precision, cache, ...).
        table_overrides: per-field specs that replace ``tables`` for those fields.
        encoder: factory ``(n_fields, n_dense, embedding_dim) -> encoder``; in YAML a
            ``class_path`` such as ``ssl_rec.models.DLRMEncoder`` with its ``init_args``.
        seed: embedding initialisation / stochastic rounding seed.

    Shape:
        ``forward(batch, field_mask bool[B, F] | None) -> Representation`` with
        ``field_emb float32[B, F, D]`` and ``pooled float32[B, H]``, ``H = output_dim``.

    """

    def __init__(
        self,
        schema: FeatureSchema | Mapping[str, Any],
        embedding_dim: int = 16,
        tables: TableSpec | None = None,
        table_overrides: dict[str, TableSpec] | None = None,
        encoder: EncoderFactory = DLRMEncoder,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.schema = as_schema(schema)
        self.embedding = FieldEmbedding(
            self.schema.field_names,
            self.schema.cardinalities,
            embedding_dim,
            tables,
            table_overrides,
            seed,
        )
        self.encoder = encoder(self.schema.n_fields, self.schema.n_dense, embedding_dim)
        self.output_dim = int(self.encoder.output_dim)

    def forward(self, batch: Batch, field_mask: torch.Tensor | None = None) -> Representation:
        """Embed and encode ``batch``; ``field_mask`` replaces fields by ``[MASK]`` tokens."""
        self._check(batch)
        field_emb = self.embedding(batch.sparse, field_mask)
        pooled, dense_emb = self.encoder(field_emb, batch.dense)
        return Representation(field_emb=field_emb, pooled=pooled, dense_emb=dense_emb)

    def _check(self, batch: Batch) -> None:
        if batch.sparse.dim() != 2 or batch.sparse.shape[1] != self.schema.n_fields:
            raise ValueError(
                f"batch.sparse has shape {tuple(batch.sparse.shape)}; the schema needs "
                f"[B, {self.schema.n_fields}]"
            )
        if batch.dense.dim() != 2 or batch.dense.shape[1] != self.schema.n_dense:
            raise ValueError(
                f"batch.dense has shape {tuple(batch.dense.shape)}; the schema needs "
                f"[B, {self.schema.n_dense}]"
            )
