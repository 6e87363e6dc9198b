"""``QuantizationPlan``: the precision of every table and dense layer, and the search ladders.

A *unit* is one embedding table (named by its field) or one dense layer (named by its
qualified name in the encoder-and-head module, e.g. ``encoder.top.0``). Each unit descends
a ladder of rungs, each rung smaller than the one above it; a rung may offer alternatives
of equal size, tried in order (the faster first).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from ssl_rec.hardware import Precision
from ssl_rec.quantize.dense import DENSE_PRECISIONS

__all__ = [
    "DENSE_LADDER",
    "INTERACTION_LADDER",
    "TABLE_LADDER",
    "TINY_TABLE_LADDER",
    "QuantizationPlan",
    "Unit",
]

Kind = Literal["table", "layer"]
# Below FP32, by bytes per value; the fused INT rows add a scale and bias per row.
TABLE_LADDER: tuple[tuple[str, ...], ...] = (("fp16",), ("int8",), ("int4",), ("int2",))
# A tiny table costs nothing to keep in FP16 and gains little from INT rows, whose per-row
# scale and bias are a large part of a short row anyway.
TINY_TABLE_LADDER: tuple[tuple[str, ...], ...] = (("fp16",),)
# 2 bytes per weight, then 1. bf16 runs bfloat16 products (fast on CPUs with AVX512-BF16),
# so it is tried before FP16 storage; FBGEMM's INT8 kernel is the fastest 1-byte layer on
# x86, then torchao's (eager on CPU) in case FBGEMM's per-batch activation scale costs NE.
DENSE_LADDER: tuple[tuple[str, ...], ...] = (
    ("bf16", "fp16"),
    ("int8_fbgemm", "int8_weight_only", "int8_dynamic"),
)
# An interaction stores nothing: bfloat16 products save time, not bytes, and only over
# torch.bmm in FP32; the search skips the move where the compiled FP32 kernel serves.
INTERACTION_LADDER: tuple[tuple[str, ...], ...] = (("bf16",),)


@dataclass(frozen=True, order=True)
class Unit:
    """One table (``kind="table"``, ``name`` = field) or dense layer (qualified name)."""

    kind: Kind
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass(frozen=True)
class QuantizationPlan:
    """Precision of each table (field -> ``Precision`` name) and layer (name -> dense precision).

    Args:
        tables: one entry per categorical field, in field order.
        layers: one entry per ``nn.Linear`` of the encoder and head.

    Example:
        >>> plan = QuantizationPlan.fp32(["C1"], ["head.mlp.0"])
        >>> plan.with_precision(Unit("table", "C1"), "int4").tables
        {'C1': 'int4'}

    """

    tables: dict[str, str] = field(default_factory=dict)
    layers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        tables = {str(k): Precision(v).value for k, v in self.tables.items()}
        bad = {k: v for k, v in self.layers.items() if v not in DENSE_PRECISIONS}
        if bad:
            raise ValueError(f"layer precisions {bad} are not among {list(DENSE_PRECISIONS)}")
        object.__setattr__(self, "tables", tables)
        object.__setattr__(self, "layers", {str(k): str(v) for k, v in self.layers.items()})

    @classmethod
    def fp32(cls, fields: list[str], layers: list[str]) -> QuantizationPlan:
        """Every table and layer in FP32 (the trained model)."""
        return cls(dict.fromkeys(fields, "fp32"), dict.fromkeys(layers, "fp32"))

    def units(self) -> Iterator[Unit]:
        """Every table, then every layer."""
        yield from (Unit("table", name) for name in self.tables)
        yield from (Unit("layer", name) for name in self.layers)

    def precision(self, unit: Unit) -> str:
        """The precision of ``unit``."""
        return (self.tables if unit.kind == "table" else self.layers)[unit.name]

    def with_precision(self, unit: Unit, precision: str) -> QuantizationPlan:
        """A copy with ``unit`` at ``precision``."""
        if unit.kind == "table":
            return replace(self, tables={**self.tables, unit.name: precision})
        return replace(self, layers={**self.layers, unit.name: precision})

    def to_dict(self) -> dict[str, dict[str, str]]:
        """``{"tables": {...}, "layers": {...}}``."""
        return {"tables": dict(self.tables), "layers": dict(self.layers)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, str]]) -> QuantizationPlan:
        """Inverse of :meth:`to_dict` (``ValueError`` on a malformed document)."""
        if not isinstance(data, Mapping) or not {"tables", "layers"} <= set(data):
            raise ValueError(f"a quantization plan needs 'tables' and 'layers', got {data!r}")
        return cls(dict(data["tables"]), dict(data["layers"]))
