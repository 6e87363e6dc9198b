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
from ssl_rec.hardware.table_allocation import declared_state
from ssl_rec.models.dlrm import DLRMEncoder
from ssl_rec.models.field_embedding import FieldEmbedding
from ssl_rec.models.numeric_encoding import DenseStandardizer, legacy_dense_state
from ssl_rec.models.numeric_tokens import NumericTokenizer, TokenEncoder, is_token_encoding
from ssl_rec.schema import FeatureSchema
from ssl_rec.types import BackboneDims, Batch, Representation
from ssl_rec.vocab import DENSE_QUANTILE_BINS, DenseStatistics, Vocabularies

EncoderFactory = Callable[[int, int, int], nn.Module]
_TABLES = "embedding.tables."
_DENSE_ENCODING = "dense_encoding."


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
        dense_encoding: ``"standardize"`` (default): dense columns become
            ``(x - mean) / std`` with the training split's statistics (from
            ``schema.metadata["dense_statistics"]`` or :meth:`set_dense_statistics`; buffers,
            so checkpoints carry them); ``"none"``: the encoder sees the preprocessed values.
            A checkpoint written before the statistics existed loads as ``"none"``.
            ``"quantile_tokens"`` / ``"periodic_tokens"``: standardized, then each column
            becomes a ``D``-dim token (:class:`~ssl_rec.models.numeric_tokens.NumericTokenizer`,
            piecewise-linear over the training quantile bins, or periodic); the encoder is
            built for ``F + n_dense`` tokens and no dense input, and objectives may mask the
            columns' tokens and predict their quantile bins (:meth:`dense_bins`).

    Shape:
        ``forward(batch, field_mask bool[B, F] or bool[B, F + F_num] | None) -> Representation``
        with ``field_emb float32[B, F, D]``, ``numeric_emb float32[B, F_num, D]`` (token
        encodings; ``F_num = dims.n_numeric_tokens``) and ``pooled float32[B, H]``,
        ``H = dims.output_dim``.

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
        dense_encoding: str = "standardize",
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
        self.dense_encoding = DenseStandardizer(self.schema.n_dense, dense_encoding)
        n_dense, n_tokens = self.schema.n_dense, 0
        self.numeric_tokens: NumericTokenizer | None = None
        statistics = DenseStatistics.from_schema_metadata(self.schema.metadata)
        if is_token_encoding(dense_encoding) and n_dense:
            bins = DENSE_QUANTILE_BINS if statistics is None else statistics.bins
            self.numeric_tokens = NumericTokenizer(
                n_dense, embedding_dim, dense_encoding, bins=bins, seed=seed
            )
            n_dense, n_tokens = 0, self.schema.n_dense
        self.encoder = encoder(self.schema.n_fields + n_tokens, n_dense, embedding_dim)
        self._dims = BackboneDims(
            n_fields=self.schema.n_fields,
            n_dense=self.schema.n_dense,
            embedding_dim=embedding_dim,
            output_dim=int(self.encoder.output_dim),
            cardinalities=tuple(self.schema.cardinalities),
            n_numeric_tokens=n_tokens,
            numeric_bins=0 if self.numeric_tokens is None else self.numeric_tokens.bins,
        )
        self._vocabulary: Vocabularies | None = None
        self.set_dense_statistics(statistics)

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
    def dense_statistics_set(self) -> bool:
        """Whether the dense columns' statistics were set, or loaded with the weights."""
        return self.dense_encoding.fitted

    def set_dense_statistics(self, statistics: DenseStatistics | None) -> None:
        """Standardize the dense columns with ``statistics`` of the training split from now on.

        Statistics of more columns (a tower's data) give those of the schema's, by name.

        Raises:
            ValueError: when they lack one of the schema's dense columns.

        """
        if statistics is not None:
            statistics = statistics.select(self.schema.dense)
        self.dense_encoding.set_statistics(statistics)
        if statistics is not None and self.numeric_tokens is not None:
            self.numeric_tokens.set_statistics(statistics, self.dense_encoding.std)

    @property
    def numeric_encoding(self) -> str:
        """The ``dense_encoding`` option: ``standardize``, ``none`` or a token encoding."""
        return self.dense_encoding.encoding

    def standardize_dense(self, dense: torch.Tensor) -> torch.Tensor:
        """``float32[B, n_dense]`` preprocessed values -> what the encoder sees (same shape)."""
        return self.dense_encoding(dense)

    def unstandardize_dense(self, standardized: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`standardize_dense`."""
        return self.dense_encoding.inverse(standardized)

    def embed_dense(
        self, dense: torch.Tensor, numeric_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Preprocessed ``float32[B, n_dense]`` to tokens ``float32[B, F_num, D]``.

        ``[MASK]`` tokens where ``numeric_mask bool[B, F_num]`` is set; ``F_num = 0`` (an empty
        ``[B, 0, D]``) unless ``dense_encoding`` is a token encoding.
        """
        if self.numeric_tokens is None:
            return dense.new_zeros(dense.shape[0], 0, self.dims.embedding_dim)
        return self.numeric_tokens(self.dense_encoding(dense), numeric_mask)

    def dense_bins(self, dense: torch.Tensor) -> torch.Tensor:
        """``int64[B, F_num]`` training quantile bin of each tokenized column of ``dense``.

        The classes (``dims.numeric_bins``) an objective predicts for a masked numeric token.
        """
        if self.numeric_tokens is None:
            return torch.zeros(dense.shape[0], 0, dtype=torch.long, device=dense.device)
        return self.numeric_tokens.bin_ids(self.dense_encoding(dense))

    def clone_dense_encoding(self) -> nn.Module:
        """A frozen copy of the dense standardizer (for models that serve without the backbone)."""
        return copy.deepcopy(self.dense_encoding).requires_grad_(False)

    @property
    def dims(self) -> BackboneDims:
        """Sizes of the fields, tokens and pooled vector."""
        return self._dims

    def forward(self, batch: Batch, field_mask: torch.Tensor | None = None) -> Representation:
        """Embed and encode ``batch``; ``field_mask`` puts ``[MASK]`` tokens in.

        ``field_mask`` is ``bool[B, F]`` (categorical fields) or ``bool[B, F + F_num]``
        (then its last ``F_num`` columns mask the numeric tokens).
        """
        self._check(batch)
        n_fields, numeric_mask = self.schema.n_fields, None
        if field_mask is not None and field_mask.shape[-1] != n_fields:
            if field_mask.shape[-1] != n_fields + self.dims.n_numeric_tokens:
                raise ValueError(
                    f"field_mask has {field_mask.shape[-1]} columns; the backbone has "
                    f"{n_fields} fields and {self.dims.n_numeric_tokens} numeric tokens"
                )
            field_mask, numeric_mask = field_mask[:, :n_fields], field_mask[:, n_fields:]
        field_emb = self.embed(batch.sparse, field_mask)
        standardized = self.dense_encoding(batch.dense)  # once, for the tokens and the encoder
        numeric_emb = None
        if self.numeric_tokens is not None:
            numeric_emb = self.numeric_tokens(standardized, numeric_mask)
        pooled, dense_emb = self._encode_standardized(field_emb, standardized, numeric_emb)
        return Representation(field_emb, pooled, dense_emb, numeric_emb)

    def embed(self, sparse: torch.Tensor, field_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Look up ``sparse int64[B, F]``: ``float32[B, F, D]``, ``[MASK]`` where masked.

        In training mode the lookup's backward updates the tables in place (fused optimizer).
        """
        return self.embedding(sparse, field_mask)

    def encode(
        self,
        field_emb: torch.Tensor,
        dense: torch.Tensor,
        numeric_emb: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the encoder: ``(pooled float32[B, H], dense_emb float32[B, D] | None)``.

        ``dense`` holds the preprocessed values; they are standardized here. With numeric
        tokens the encoder reads ``[field_emb, numeric_emb]`` (``[B, F + F_num, D]``);
        ``numeric_emb`` defaults to :meth:`embed_dense` of ``dense`` (nothing masked).
        """
        return self._encode_standardized(field_emb, self.dense_encoding(dense), numeric_emb)

    def _encode_standardized(
        self,
        field_emb: torch.Tensor,
        standardized: torch.Tensor,
        numeric_emb: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.numeric_tokens is None:
            return self.encoder(field_emb, standardized)
        if numeric_emb is None:
            numeric_emb = self.numeric_tokens(standardized)
        tokens = torch.cat([field_emb, numeric_emb.to(field_emb.dtype)], dim=1)
        return self.encoder(tokens, standardized[:, :0])

    def entity_vectors(self, field: str, ids: torch.Tensor) -> torch.Tensor:
        """Current (dequantized) vectors of ``ids int64[n]`` of ``field``: ``float32[n, D]``."""
        return self.embedding.rows(self.schema.field_index(field), ids)

    def clone_encoder(self) -> nn.Module:
        """A frozen deep copy of the encoder, for momentum (target) encoders.

        It takes ``(field_emb [B, F, D], standardized dense [B, n_dense])``
        (:meth:`standardize_dense`); with numeric tokens it holds a copy of the tokenizer too
        and takes an optional third ``numeric_mask bool[B, F_num]``.
        """
        return copy.deepcopy(self._full_encoder()).requires_grad_(False)

    def update_encoder_copy(self, target: nn.Module, momentum: float) -> None:
        """Move a :meth:`clone_encoder` copy towards the encoder by :func:`ema_update`."""
        ema_update(target, self._full_encoder(), momentum)

    def _full_encoder(self) -> nn.Module:
        if self.numeric_tokens is None:
            return self.encoder
        return TokenEncoder(self.numeric_tokens, self.encoder)

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

        Same table formats: loaded as is (declared tables keep them as pending values, see
        ``MixedPrecisionEmbeddingCollection``). Other formats (e.g. pretrained in FP32,
        fine-tuned in INT8): the saved tables are rebuilt in their own format, read as FP32
        rows (cache included) and quantized into this backbone's format; dense parameters
        and ``[MASK]`` tokens are copied exactly.

        Raises:
            ValueError: naming the missing / unexpected / mis-shaped keys when the schema,
                ``embedding_dim`` or encoder differ.

        """
        # Weights trained before the statistics existed saw unstandardized columns.
        state = legacy_dense_state(state, _DENSE_ENCODING, self.schema.n_dense)
        tables = {k[len(_TABLES) :]: v for k, v in state.items() if k.startswith(_TABLES)}
        with declared_state():  # shapes only: declared tables stay unallocated (pending)
            own = self.state_dict()
        dense = {k: v for k, v in state.items() if not k.startswith(_TABLES)}
        mismatch = _state_mismatch({k: v for k, v in own.items() if not k.startswith(_TABLES)},
                                   dense)  # fmt: skip
        if not mismatch and self.embedding.tables.matches_state(tables):
            self.load_state_dict(state)  # same formats: exact, caches and optimizer state too
            return
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
