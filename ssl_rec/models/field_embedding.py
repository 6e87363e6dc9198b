"""Per-field embedding tables with a learned [MASK] token per field."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from ssl_rec._checks import check_known_keys
from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec


class FieldEmbedding(nn.Module):
    """One table per categorical field, stored at the precision each :class:`TableSpec` asks.

    Storage, caching and the fused optimizer live in ``ssl_rec.hardware``; this module adds
    the learned ``[MASK]`` token per field that views use to hide fields.

    Args:
        field_names: names of the ``F`` fields, in column order.
        cardinalities: ids per field (including the reserved id 0).
        embedding_dim: ``D``.
        tables: spec used for every table not named in ``table_overrides``.
        table_overrides: field name -> spec for that table (e.g. keep a small field FP32).
        seed: seed of the table initialisation and of stochastic rounding.

    Shape:
        ``sparse int64[B, F]``, ``field_mask bool[B, F] | None`` -> ``float32[B, F, D]``.

    """

    def __init__(
        self,
        field_names: Sequence[str],
        cardinalities: Sequence[int],
        embedding_dim: int,
        tables: TableSpec | None = None,
        table_overrides: Mapping[str, TableSpec] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if len(field_names) != len(cardinalities):
            raise ValueError(
                f"FieldEmbedding: {len(field_names)} field names, "
                f"{len(cardinalities)} cardinalities"
            )
        if embedding_dim <= 0:
            raise ValueError(f"FieldEmbedding.embedding_dim must be positive, got {embedding_dim}")
        overrides = dict(table_overrides or {})
        check_known_keys("FieldEmbedding", "table_overrides", overrides, field_names, "fields")
        default = tables or TableSpec()
        self.field_names = list(field_names)
        self.specs = [overrides.get(name, default) for name in self.field_names]
        self.tables = MixedPrecisionEmbeddingCollection(
            list(cardinalities), embedding_dim, self.specs, seed=seed, table_names=self.field_names
        )
        self.mask_token = nn.Parameter(torch.randn(len(self.field_names), embedding_dim) * 0.05)
        self.embedding_dim = embedding_dim

    @property
    def frozen(self) -> bool:
        """Whether the tables skip their fused update in backward."""
        return bool(self.tables.frozen)

    @frozen.setter
    def frozen(self, value: bool) -> None:
        self.tables.frozen = bool(value)

    def forward(self, sparse: torch.Tensor, field_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Look up every field's id; masked positions get that field's ``[MASK]`` token."""
        emb = self.tables(sparse)
        if field_mask is None:
            return emb
        return torch.where(field_mask.unsqueeze(-1), self.mask_token.to(emb.dtype), emb)

    def rows(self, field: int, ids: torch.Tensor) -> torch.Tensor:
        """Current (dequantized) ``float32[n, D]`` rows ``ids int64[n]`` of field ``field``."""
        return self.tables.dequantize_rows(field, ids)
