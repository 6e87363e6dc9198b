"""Two towers for candidate retrieval: a query tower and an item tower, each a :class:`Backbone`.

Each tower is the library's backbone over its own columns (field embedding at any precision,
FP32 row cache, fused optimizer) with a :class:`TowerEncoder`, so everything that works on a
backbone (views, objectives, exports) works on either tower. Covington et al., "Deep Neural
Networks for YouTube Recommendations", RecSys 2016; Yi et al., "Sampling-Bias-Corrected
Neural Modeling for Large Corpus Item Recommendations", RecSys 2019.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ssl_rec._checks import check_at_least, check_known_keys
from ssl_rec.hardware import TableSpec
from ssl_rec.models.backbone import Backbone, EncoderFactory, as_schema
from ssl_rec.models.mlp import MLP
from ssl_rec.schema import FeatureSchema
from ssl_rec.types import Batch


class TowerEncoder(nn.Module):
    """An MLP over the concatenated field tokens and dense columns, L2-normalised.

    Args:
        n_fields: categorical fields ``F`` of the tower.
        n_dense: dense columns of the tower.
        embedding_dim: ``D``.
        hidden: hidden widths of the MLP.
        output_dim: ``H``, width of the (unit-norm) output.
        dropout: dropout after each hidden layer.

    Shape:
        ``field_emb float32[B, F, D]``, ``dense float32[B, n_dense]`` ->
        ``(pooled float32[B, H] with unit L2 norm, None)``.

    Example:
        >>> enc = TowerEncoder(2, 1, 4, hidden=[8], output_dim=3)
        >>> v, _ = enc(torch.randn(5, 2, 4), torch.randn(5, 1))
        >>> bool(torch.allclose(v.norm(dim=1), torch.ones(5)))
        True

    """

    def __init__(
        self,
        n_fields: int,
        n_dense: int,
        embedding_dim: int,
        hidden: Sequence[int] = (64,),
        output_dim: int = 32,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        output_dim = check_at_least("TowerEncoder", "output_dim", output_dim)
        self.mlp = MLP(n_fields * embedding_dim + n_dense, [*hidden, output_dim], dropout)
        self.hidden, self.dropout = [int(h) for h in hidden], float(dropout)
        self.output_dim = int(output_dim)

    def forward(self, field_emb: torch.Tensor, dense: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Encode one batch into unit vectors (no separate dense embedding)."""
        x = torch.cat([field_emb.flatten(1), dense.to(field_emb.dtype)], dim=1)
        return F.normalize(self.mlp(x), dim=-1), None


def tower_schema(schema: FeatureSchema, columns: Sequence[str], tower: str) -> FeatureSchema:
    """The sub-schema of ``columns`` (categorical and dense names of ``schema``), no label.

    Columns keep the order of ``schema``; the metadata is carried over.

    Raises:
        ValueError: naming the tower when a column is unknown, listed twice or when the
            tower has no categorical field.

    """
    names = list(columns)
    dupes = sorted({n for n in names if names.count(n) > 1})
    known = set(schema.dense) | set(schema.field_names)
    unknown = [n for n in names if n not in known]
    if dupes or unknown:
        raise ValueError(
            f"TwoTowerModel.{tower}_fields: unknown {unknown}, repeated {dupes}; the data's "
            f"columns are {schema.field_names + list(schema.dense)}"
        )
    wanted = set(names)
    categorical = [f for f in schema.categorical if f.name in wanted]
    if not categorical:
        raise ValueError(
            f"TwoTowerModel.{tower}_fields needs at least one categorical field, got {names}"
        )
    dense = [n for n in schema.dense if n in wanted]
    return FeatureSchema(dense, categorical, None, dict(schema.metadata))


class TwoTowerModel(nn.Module):
    """A query tower over user/context columns and an item tower over item columns.

    A training batch holds the columns of both towers (one row per positive pair); the towers
    read their own columns from it. The item catalogue is a batch of the item tower's
    columns alone (``item_schema``).

    Args:
        schema: the data's schema (or its dict form), linked from the data module.
        query_fields: names of the columns (categorical or dense) of the query tower.
        item_fields: names of the columns of the item tower; disjoint from ``query_fields``.
        item_id_field: the categorical item column whose ids identify items (accidental hits,
            log-Q, metrics); default the first categorical column of the item tower.
        embedding_dim: ``D`` of both towers.
        tables: storage/optimizer spec of every table (precision, FP32 cache, ...).
        table_overrides: per-column specs that replace ``tables``.
        query_encoder: encoder factory of the query tower (``TowerEncoder`` by default).
        item_encoder: encoder factory of the item tower; same ``output_dim`` as the query's.
        seed: initialisation seed (the item tower uses ``seed + 1``).

    Shape:
        ``forward(batch) -> (query float32[B, H], item float32[B, H])``, unit rows.

    """

    def __init__(
        self,
        schema: FeatureSchema | Mapping[str, Any],
        query_fields: Sequence[str],
        item_fields: Sequence[str],
        item_id_field: str | None = None,
        embedding_dim: int = 16,
        tables: TableSpec | None = None,
        table_overrides: dict[str, TableSpec] | None = None,
        query_encoder: EncoderFactory = TowerEncoder,
        item_encoder: EncoderFactory = TowerEncoder,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.schema = as_schema(schema)
        shared = sorted(set(query_fields) & set(item_fields))
        if shared:
            raise ValueError(f"TwoTowerModel: columns {shared} are listed for both towers")
        self.query_schema = tower_schema(self.schema, query_fields, "query")
        self.item_schema = tower_schema(self.schema, item_fields, "item")
        item_names = self.item_schema.field_names
        self.item_id_field = item_names[0] if item_id_field is None else item_id_field
        if self.item_id_field not in item_names:
            raise ValueError(
                f"TwoTowerModel.item_id_field={self.item_id_field!r} is not a categorical "
                f"column of the item tower {item_names}"
            )
        overrides = dict(table_overrides or {})
        check_known_keys(
            "TwoTowerModel", "table_overrides", overrides, self.schema.field_names, "fields"
        )

        def tower(sub: FeatureSchema, encoder: EncoderFactory, tower_seed: int) -> Backbone:
            own = {k: v for k, v in overrides.items() if k in sub.field_names}
            return Backbone(sub, embedding_dim, tables, own, encoder, tower_seed)

        self.query_tower = tower(self.query_schema, query_encoder, seed)
        self.item_tower = tower(self.item_schema, item_encoder, seed + 1)
        q_dim, i_dim = self.query_tower.dims.output_dim, self.item_tower.dims.output_dim
        if q_dim != i_dim:
            raise ValueError(
                f"TwoTowerModel: the query tower outputs {q_dim} and the item tower {i_dim} "
                "dimensions; give both encoders the same output_dim"
            )
        for name, sub in (("query", self.query_schema), ("item", self.item_schema)):
            sparse = [self.schema.field_index(n) for n in sub.field_names]
            dense = [list(self.schema.dense).index(n) for n in sub.dense]
            self.register_buffer(f"_{name}_sparse", torch.tensor(sparse, dtype=torch.long),
                                 persistent=False)  # fmt: skip
            self.register_buffer(f"_{name}_dense", torch.tensor(dense, dtype=torch.long),
                                 persistent=False)  # fmt: skip

    @property
    def output_dim(self) -> int:
        """``H``, the width of both towers' unit vectors."""
        return int(self.query_tower.dims.output_dim)

    def query_batch(self, batch: Batch) -> Batch:
        """The query tower's columns of a full-schema ``batch`` (labels dropped)."""
        return Batch(batch.dense[:, self._query_dense], batch.sparse[:, self._query_sparse])

    def item_batch(self, batch: Batch) -> Batch:
        """The item tower's columns of a full-schema ``batch`` (labels dropped)."""
        return Batch(batch.dense[:, self._item_dense], batch.sparse[:, self._item_sparse])

    def item_ids(self, batch: Batch) -> torch.Tensor:
        """``int64[B]`` ids of ``item_id_field`` in a full-schema ``batch``."""
        return batch.sparse[:, self.schema.field_index(self.item_id_field)]

    def encode_queries(self, batch: Batch) -> torch.Tensor:
        """``float32[B, H]`` unit query vectors of a full-schema ``batch``."""
        return self.query_tower(self.query_batch(batch)).pooled

    def encode_items(self, items: Batch) -> torch.Tensor:
        """``float32[N, H]`` unit vectors of a batch of the item tower's columns alone."""
        return self.item_tower(items).pooled

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Both towers on a full-schema ``batch``: ``(query [B, H], item [B, H])``."""
        return self.encode_queries(batch), self.encode_items(self.item_batch(batch))
