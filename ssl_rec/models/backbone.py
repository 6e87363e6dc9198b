"""Backbone: field embeddings + an interaction encoder, and the surface the package uses.

Objectives, views, probes, exports and checkpoints use only the methods declared here (and
listed by :class:`ssl_rec.types.BackboneProtocol`), never the attributes behind them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ssl_rec.hardware import TableSpec
from ssl_rec.models.dlrm import DLRMEncoder
from ssl_rec.models.field_embedding import FieldEmbedding
from ssl_rec.schema import FeatureSchema
from ssl_rec.types import BackboneDims, Batch, Representation
from ssl_rec.vocab import Vocabularies

EncoderFactory = Callable[[int, int, int], nn.Module]
_TABLES = "embedding.tables."


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
        ``field_emb float32[B, F, D]`` and ``pooled float32[B, H]``, ``H = dims.output_dim``.

    Example:
        >>> from ssl_rec.schema import CategoricalField
        >>> schema = FeatureSchema(["I1"], [CategoricalField("C1", 10)], "label")
        >>> backbone = Backbone(schema, embedding_dim=8)
        >>> backbone.dims.output_dim
        128

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
        self._dims = BackboneDims(
            n_fields=self.schema.n_fields,
            n_dense=self.schema.n_dense,
            embedding_dim=embedding_dim,
            output_dim=int(self.encoder.output_dim),
            cardinalities=tuple(self.schema.cardinalities),
        )
        self._vocabulary: Vocabularies | None = None

    @property
    def vocabulary(self) -> Vocabularies | None:
        """What each id of each field means (the raw value of every row), or ``None``.

        Set from the data the model is trained on or from the checkpoint it is loaded from;
        ``None`` means the ids were given directly and are their own values.
        """
        return self._vocabulary

    def set_vocabulary(self, vocabulary: Vocabularies | None) -> None:
        """Attach the vocabularies the tables' rows were trained for.

        Raises:
            ValueError: when its fields or cardinalities differ from the schema's.

        """
        if vocabulary is not None:
            vocabulary.check_schema(self.schema, "the vocabulary given to the backbone")
        self._vocabulary = vocabulary

    @property
    def dims(self) -> BackboneDims:
        """Sizes of the fields, tokens and pooled vector."""
        return self._dims

    def forward(self, batch: Batch, field_mask: torch.Tensor | None = None) -> Representation:
        """Embed and encode ``batch``; ``field_mask bool[B, F]`` puts ``[MASK]`` tokens in."""
        self._check(batch)
        field_emb = self.embed(batch.sparse, field_mask)
        pooled, dense_emb = self.encode(field_emb, batch.dense)
        return Representation(field_emb=field_emb, pooled=pooled, dense_emb=dense_emb)

    def embed(self, sparse: torch.Tensor, field_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Look up ``sparse int64[B, F]``: ``float32[B, F, D]``, ``[MASK]`` where masked.

        In training mode the lookup's backward updates the tables in place (fused optimizer).
        """
        return self.embedding(sparse, field_mask)

    def encode(
        self, field_emb: torch.Tensor, dense: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the encoder: ``(pooled float32[B, H], dense_emb float32[B, D] | None)``."""
        return self.encoder(field_emb, dense)

    def entity_vectors(self, field: str, ids: torch.Tensor) -> torch.Tensor:
        """Current (dequantized) vectors of ``ids int64[n]`` of ``field``: ``float32[n, D]``."""
        return self.embedding.rows(self.schema.field_index(field), ids)

    def clone_encoder(self) -> nn.Module:
        """A frozen deep copy of the encoder, for momentum (target) encoders."""
        return copy.deepcopy(self.encoder).requires_grad_(False)

    def update_encoder_copy(self, target: nn.Module, momentum: float) -> None:
        """Move a :meth:`clone_encoder` copy towards the encoder by :func:`ema_update`."""
        ema_update(target, self.encoder, momentum)

    # Table controls: the embedding tables are buffers with a fused optimizer, not Parameters.

    @property
    def table_specs(self) -> list[TableSpec]:
        """The spec of each field's table, in field order."""
        return list(self.embedding.tables.specs)

    @property
    def tables_frozen(self) -> bool:
        """Whether the tables skip their fused update in backward."""
        return self.embedding.frozen

    def freeze_tables(self, frozen: bool = True) -> None:
        """Stop (or restart) the tables' fused updates and cache admissions."""
        self.embedding.frozen = frozen

    def set_table_learning_rate(self, learning_rate: float) -> None:
        """Step every table's fused optimizer with ``learning_rate`` (> 0) from now on."""
        self.embedding.tables.set_learning_rate(learning_rate)

    def prefetch_tables(self, sparse: torch.Tensor | None, background: bool = True) -> None:
        """Admit the next batch's ``sparse int64[B, F]`` ids after the next training lookup.

        On a helper thread when ``background``, beside the dense layers; same results either
        way. ``None`` cancels.
        """
        self.embedding.tables.prefetch_next(sparse, background)

    def reset_table_optimizer(self) -> None:
        """Zero the tables' row-wise Adagrad state (a fresh optimizer, as for dense layers)."""
        self.embedding.tables.reset_optimizer_state()

    def table_stats(self) -> dict[str, Any]:
        """``{"memory": memory_report(), "cache": cache_stats()}`` of the tables."""
        tables = self.embedding.tables
        return {"memory": tables.memory_report(), "cache": tables.cache_stats()}

    def load_weights(self, state: Mapping[str, torch.Tensor], where: str = "state") -> None:
        """Load a backbone ``state_dict`` whose tables may be stored in other precisions.

        Same table formats: loaded as is. Other formats (e.g. pretrained in FP32,
        fine-tuned in INT8): the saved tables are rebuilt in their own format, read as FP32
        rows (cache included) and quantized into this backbone's format; dense parameters
        and ``[MASK]`` tokens are copied exactly.

        Raises:
            ValueError: naming the missing / unexpected / mis-shaped keys when the schema,
                ``embedding_dim`` or encoder differ.

        """
        tables = {k[len(_TABLES) :]: v for k, v in state.items() if k.startswith(_TABLES)}
        if self.embedding.tables.matches_state(tables):
            self.load_state_dict(state)  # same formats: exact, caches and optimizer state too
            return
        own = self.state_dict()
        dense = {k: v for k, v in state.items() if not k.startswith(_TABLES)}
        mismatch = _state_mismatch({k: v for k, v in own.items() if not k.startswith(_TABLES)},
                                   dense)  # fmt: skip
        try:
            weights = self.embedding.tables.weights_from_state(tables)
        except ValueError as e:
            mismatch = mismatch or str(e)
            weights = []
        expected = [(c, self.dims.embedding_dim) for c in self.dims.cardinalities]
        if mismatch or [tuple(w.shape) for w in weights] != expected:
            raise ValueError(
                f"{where}: backbone does not match this model ({mismatch or 'table shapes'}); "
                "use the same schema, embedding_dim and encoder"
            )
        self.load_state_dict(dense, strict=False)
        self.embedding.tables.load_weights(weights)

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


@torch.no_grad()
def ema_update(target: nn.Module, online: nn.Module, momentum: float) -> None:
    """``target <- momentum * target + (1 - momentum) * online`` for parameters; buffers copied.

    He et al., MoCo, CVPR 2020, https://arxiv.org/abs/1911.05722 (Eq. 2).
    """
    for t, o in zip(target.parameters(), online.parameters(), strict=True):
        t.lerp_(o.detach(), 1.0 - momentum)
    for t, o in zip(target.buffers(), online.buffers(), strict=True):
        t.copy_(o)


def _state_mismatch(own: Mapping[str, torch.Tensor], theirs: Mapping[str, torch.Tensor]) -> str:
    """Describe how two state dicts differ in keys or shapes ("" when they match)."""
    shapes = [
        f"{k}: saved {tuple(v.shape)} vs model {tuple(own[k].shape)}"
        for k, v in theirs.items()
        if k in own and tuple(v.shape) != tuple(own[k].shape)
    ]
    missing, unexpected = sorted(set(own) - set(theirs)), sorted(set(theirs) - set(own))
    if not (shapes or missing or unexpected):
        return ""
    return f"missing={missing[:5]}, unexpected={unexpected[:5]}, shapes={shapes[:5]}"
