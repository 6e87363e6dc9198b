"""The serving model: quantized tables, then the dense part (encoder and click head).

:class:`FloatCTR` holds what post-training quantization starts from (FP32 table weights,
the dense part, how to rebuild it); :class:`ModelBuilder` turns a
:class:`~ssl_rec.quantize.quantization_plan.QuantizationPlan` into an :class:`InferenceCTRModel`,
reusing each table and layer it has already converted (the search builds hundreds).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ssl_rec.class_paths import check_class_paths, resolve_class
from ssl_rec.hardware import Precision, quantize_rows, serving_kernels
from ssl_rec.models import Backbone, CTRHead, DenseStandardizer
from ssl_rec.quantize.dense import (
    convert_layer,
    dense_layers,
    fuse_relus,
    relu_followed,
    tensor_bytes,
)
from ssl_rec.quantize.fused import dlrm_logits, fusable
from ssl_rec.quantize.quantization_plan import QuantizationPlan, Unit
from ssl_rec.quantize.serving_wide import ServingWide
from ssl_rec.quantize.tables import QuantizedTables
from ssl_rec.schema import FeatureSchema

__all__ = ["Architecture", "DenseCTR", "FloatCTR", "InferenceCTRModel", "ModelBuilder"]

_ROW_CHUNK = 1 << 16


class DenseCTR(nn.Module):
    """Encoder then click head: ``(field_emb float32[B, F, D], dense float32[B, n]) -> [B]``.

    Args:
        encoder: the backbone's encoder.
        head: the click head.
        dense_encoding: the backbone's dense standardizer (training statistics as buffers),
            applied to ``dense`` first (a state saved before it existed loads as the identity).

    """

    def __init__(self, encoder: nn.Module, head: nn.Module, dense_encoding: nn.Module) -> None:
        super().__init__()
        self.dense_encoding = dense_encoding
        self.encoder = encoder
        self.head = head

    def forward(self, field_emb: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """Click logits ``float32[B]``."""
        pooled, _ = self.encoder(field_emb, self.dense_encoding(dense))
        return self.head(pooled)


@dataclass(frozen=True)
class Architecture:
    """How to rebuild the dense part without the code that trained it (plain values).

    Args:
        embedding_dim: ``D``.
        encoder: ``{"class_path": ..., "init_args": {...}}`` of the encoder, called as
            ``cls(n_fields, n_dense, embedding_dim, **init_args)`` like the backbone does.
        head_hidden: hidden widths of the click head.
        wide: whether the model adds a wide (linear) term, served in FP32
            (:class:`~ssl_rec.quantize.serving_wide.ServingWide`).

    """

    embedding_dim: int
    encoder: dict[str, Any]
    head_hidden: list[int] = field(default_factory=list)
    wide: bool = False

    def build(self, schema: FeatureSchema) -> DenseCTR:
        """An FP32 dense part with fresh weights (load a state into it)."""
        where = "the model's architecture"  # a manifest was checked with its file name
        check_class_paths(self.encoder, where, "encoder")
        cls = resolve_class(self.encoder.get("class_path"), where, "encoder.class_path")
        if not issubclass(cls, nn.Module):
            raise ValueError(f"encoder class_path {self.encoder['class_path']!r} is not a module")
        init_args = dict(self.encoder.get("init_args") or {})
        encoder = cls(schema.n_fields, schema.n_dense, self.embedding_dim, **init_args)
        head = CTRHead(int(encoder.output_dim), list(self.head_hidden))
        return DenseCTR(encoder, head, DenseStandardizer(schema.n_dense)).eval()

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (``wide`` only when set: a manifest without it is a deep model)."""
        out = {
            "embedding_dim": self.embedding_dim,
            "encoder": self.encoder,
            "head_hidden": list(self.head_hidden),
        }
        return out | {"wide": True} if self.wide else out


@dataclass
class FloatCTR:
    """A trained CTR model in FP32: the starting point of post-training quantization.

    Args:
        schema: the data's feature schema.
        weights: FP32 ``[R_f, D]`` rows of each table, in field order.
        dense: the FP32 encoder and head.
        architecture: how to rebuild ``dense`` when a quantized model is loaded (``None``:
            the models built from it can serve but not be saved).
        wide: the model's wide term (kept in FP32 by every plan), or ``None``.

    """

    schema: FeatureSchema
    weights: list[torch.Tensor]
    dense: DenseCTR
    architecture: Architecture | None
    wide: ServingWide | None = None

    @classmethod
    def from_backbone(
        cls,
        backbone: Backbone,
        head: nn.Module,
        architecture: Architecture | None = None,
        wide: ServingWide | None = None,
    ) -> FloatCTR:
        """Read the tables (dequantized, whatever their training format) and copy the rest.

        Raises:
            ValueError: when ``architecture`` does not rebuild the backbone's encoder/head, or
                when the backbone embeds its dense columns as tokens (not served yet).

        """
        refuse_numeric_tokens(backbone)
        weights = [
            _table_weights(backbone, name, card)
            for name, card in zip(
                backbone.schema.field_names, backbone.schema.cardinalities, strict=True
            )
        ]
        dense = DenseCTR(
            backbone.clone_encoder(), copy.deepcopy(head), backbone.clone_dense_encoding()
        )
        dense = dense.eval().requires_grad_(False)
        if architecture is not None:
            try:
                architecture.build(backbone.schema).load_state_dict(dense.state_dict())
            except RuntimeError as e:
                raise ValueError(
                    f"the model's description {architecture.to_dict()} does not "
                    f"rebuild its encoder and head: {str(e).splitlines()[0]}"
                ) from e
        return cls(backbone.schema, weights, dense, architecture, wide)

    @property
    def embedding_dim(self) -> int:
        """``D``."""
        return int(self.weights[0].shape[1])

    def layer_names(self) -> list[str]:
        """Qualified names of the dense part's Linear layers and interactions."""
        return [name for name, _ in dense_layers(self.dense)]

    def fp32_plan(self) -> QuantizationPlan:
        """The plan that keeps everything in FP32."""
        return QuantizationPlan.fp32(self.schema.field_names, self.layer_names())


def refuse_numeric_tokens(backbone: Backbone) -> None:
    """Raise ``ValueError`` naming the option when ``backbone`` embeds dense columns as tokens.

    The serving model (:class:`DenseCTR`, the fused DLRM path) rebuilds the encoder from its
    manifest for ``F`` fields and ``n_dense`` columns; the numeric tokenizer is not part of it.
    """
    if backbone.dims.n_numeric_tokens:
        raise ValueError(
            f"backbone.dense_encoding={backbone.numeric_encoding!r} (numeric tokens) cannot be "
            "quantized or served yet; train with dense_encoding: standardize to quantize"
        )


def _table_weights(backbone: Backbone, field_name: str, cardinality: int) -> torch.Tensor:
    with torch.no_grad():
        chunks = [
            backbone.entity_vectors(field_name, torch.arange(s, min(s + _ROW_CHUNK, cardinality)))
            for s in range(0, cardinality, _ROW_CHUNK)
        ]
    return torch.cat(chunks).float()


class InferenceCTRModel(nn.Module):
    """A CTR model for serving: ``logits = dense(tables(sparse), dense_features)``.

    Args:
        schema: the data's feature schema.
        tables: the embedding tables.
        dense: encoder and head, some layers replaced by low-precision twins.
        architecture: how to rebuild ``dense`` (saved with the model).
        plan: the precision of each table and layer.
        wide: the wide term added to the logits (FP32), or ``None``.

    Shape:
        ``forward(dense float32[B, n_dense], sparse int64[B, F]) -> float32[B]`` logits.

    """

    def __init__(
        self,
        schema: FeatureSchema,
        tables: QuantizedTables,
        dense: DenseCTR,
        architecture: Architecture | None,
        plan: QuantizationPlan,
        wide: ServingWide | None = None,
    ) -> None:
        super().__init__()
        self.schema, self.architecture, self.plan = schema, architecture, plan
        self.tables = tables
        self.dense = dense
        self.wide = wide
        self.eval()

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """Click logits ``float32[B]`` (a DLRM without its two concatenations, see ``fused``)."""
        if dense.dim() != 2 or dense.shape[1] != self.schema.n_dense:
            raise ValueError(
                f"dense features have shape {tuple(dense.shape)}; the model needs "
                f"[B, {self.schema.n_dense}]"
            )
        if sparse.dim() == 2 and sparse.shape[0] != dense.shape[0]:
            raise ValueError(
                f"{dense.shape[0]} rows of dense features but {sparse.shape[0]} of sparse ids"
            )
        if serving_kernels() is not None and fusable(self.dense, dense):
            logits = dlrm_logits(self.tables, self.dense, dense, sparse).float()
        else:
            logits = self.dense(self.tables(sparse), dense).float()
        return logits if self.wide is None else logits + self.wide(sparse, dense)

    def nbytes(self) -> dict[str, int]:
        """Stored bytes: ``{"tables", "dense", "total"}`` (quantized tensors as stored)."""
        tables = sum(self.tables.table_bytes())
        if self.wide is not None:  # per-id scalars, stored beside the tables
            tables += sum(tensor_bytes(t) for t in self.wide.state_dict().values())
        dense = sum(
            tensor_bytes(t) for t in self.dense.state_dict().values() if isinstance(t, torch.Tensor)
        )
        return {"tables": tables, "dense": dense, "total": tables + dense}

    def layer(self, name: str) -> nn.Module:
        """The (possibly low-precision) layer called ``name`` in the dense part."""
        return self.dense.get_submodule(name)

    def with_unit_from(self, other: InferenceCTRModel, unit: Unit) -> InferenceCTRModel:
        """A copy of this model whose table or layer ``unit`` is ``other``'s (shared, not copied).

        The debugger's instrument: swapping one unit back to the FP32 model's shows how much
        of the NE change that unit causes.
        """
        tables, dense = self.tables, self.dense
        plan = self.plan.with_precision(unit, other.plan.precision(unit))
        if unit.kind == "table":
            index = self.schema.field_index(unit.name)
            stores = [
                (other if f == index else self).tables.table_store(f)
                for f in range(self.tables.num_tables)
            ]
            precisions = [plan.tables[name] for name in self.schema.field_names]
            tables = QuantizedTables(self.tables.cardinalities, self.tables.dim, precisions, stores)
        else:
            dense = _shallow_copy(self.dense)
            dense.set_submodule(unit.name, other.layer(unit.name))
        return InferenceCTRModel(self.schema, tables, dense, self.architecture, plan, self.wide)


class ModelBuilder:
    """Builds :class:`InferenceCTRModel` s of one :class:`FloatCTR` for many plans.

    Each table quantized and each layer converted is kept, so models that differ in one
    unit share everything else (read-only: the models serve, they do not train).
    """

    def __init__(self, source: FloatCTR) -> None:
        self.source = source
        self._stores: dict[tuple[int, str], torch.Tensor] = {}
        self._layers: dict[tuple[str, str], nn.Module] = {}
        self._relu = relu_followed(source.dense)

    def table_store(self, table: int, precision: str) -> torch.Tensor:
        """Stored rows of ``table`` at ``precision`` (quantized once, rounding to nearest)."""
        key = (table, precision)
        if key not in self._stores:
            self._stores[key] = quantize_rows(self.source.weights[table], precision)
        return self._stores[key]

    def layer(self, name: str, precision: str) -> nn.Module:
        """Layer ``name`` converted to ``precision`` (once)."""
        key = (name, precision)
        if key not in self._layers:
            layer = self.source.dense.get_submodule(name)
            self._layers[key] = convert_layer(layer, precision, name in self._relu)
        return self._layers[key]

    def build(self, plan: QuantizationPlan) -> InferenceCTRModel:
        """The model of ``plan``."""
        fields = self.source.schema.field_names
        precisions = [plan.tables[name] for name in fields]
        stores = [self.table_store(i, p) for i, p in enumerate(precisions)]
        cards = self.source.schema.cardinalities
        tables = QuantizedTables(cards, self.source.embedding_dim, precisions, stores)
        dense = _shallow_copy(self.source.dense)
        for name, precision in plan.layers.items():
            dense.set_submodule(name, self.layer(name, precision))
        fuse_relus(dense, self._relu)
        source = self.source
        return InferenceCTRModel(
            source.schema, tables, dense, source.architecture, plan, source.wide
        )

    def unit_bytes(self, unit: Unit, precision: str) -> int:
        """Stored bytes of one table or layer at ``precision``."""
        if unit.kind == "table":
            index = self.source.schema.field_index(unit.name)
            dim = self.source.embedding_dim
            return Precision(precision).row_bytes(dim) * self.source.schema.cardinalities[index]
        state = self.layer(unit.name, precision).state_dict().values()
        return sum(tensor_bytes(t) for t in state if isinstance(t, torch.Tensor))


def _shallow_copy(module: nn.Module) -> nn.Module:
    """A copy of the module tree that shares parameters and buffers (no tensor is copied)."""
    memo: dict[int, Any] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        memo[id(tensor)] = tensor
    return copy.deepcopy(module, memo)


def load_dense_state(dense: DenseCTR, plan: QuantizationPlan, state: Mapping[str, Any]) -> None:
    """Convert ``dense``'s layers as ``plan`` says, then load a saved ``state`` into it."""
    relu = relu_followed(dense)
    for name, precision in plan.layers.items():
        dense.set_submodule(name, convert_layer(dense.get_submodule(name), precision, name in relu))
    fuse_relus(dense, relu)
    dense.load_state_dict(dict(state), assign=True)
