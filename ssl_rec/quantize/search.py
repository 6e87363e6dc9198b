"""Greedy sensitivity search: the smallest model whose NE stays within a budget of FP32's.

Every table and dense layer starts in FP32 and may descend its ladder
(:mod:`ssl_rec.quantize.quantization_plan`) one rung at a time. The *sensitivity* of a rung is
the NE change when that unit alone takes it (everything else FP32). Moves are taken in order of
sensitivity per byte saved, each measured on the calibration rows together with every move
accepted before it: a move is kept when the NE of the whole model stays within the budget,
otherwise undone, and that unit descends no further. A rung whose sensitivity alone exceeds
the budget is refused without that second measurement.

The budget bounds the NE change in either direction: a quantized model that scores better
than FP32 on the calibration rows does so by chance, not by being more accurate. An optional
second constraint, ``min_pair_agreement``, also keeps the fraction of calibration row pairs
the model orders as FP32 does at or above a floor (ranking, not only calibration, preserved).
"""

from __future__ import annotations

import heapq
import importlib.util
import logging
import math
from dataclasses import asdict, dataclass, field

from torch import nn

from ssl_rec._checks import check_positive
from ssl_rec.hardware import Precision, serving_kernels
from ssl_rec.models import DotInteraction
from ssl_rec.quantize.dense import TORCHAO_PRECISIONS, dense_layers
from ssl_rec.quantize.model import ModelBuilder
from ssl_rec.quantize.quantization_plan import (
    DENSE_LADDER,
    INTERACTION_LADDER,
    TABLE_LADDER,
    TINY_TABLE_LADDER,
    QuantizationPlan,
    Unit,
)
from ssl_rec.quantize.scoring import Rows, logits_of, ne_of, pair_agreement

__all__ = ["SearchResult", "SearchStep", "ladder_of", "search_plan"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchStep:
    """One move the search tried, in the order it tried them.

    Args:
        unit: ``"table C3"`` or ``"layer encoder.top.0"``.
        precision: the precision tried.
        previous: the precision it would replace.
        sensitivity: NE change with this unit alone at ``precision``.
        bytes_saved: bytes the move saves.
        ne: calibration NE of the whole model with the move (``None``: not measured, the
            sensitivity alone exceeded the budget).
        delta_ne: ``ne`` minus FP32's NE (``None`` when not measured).
        accepted: whether the move was kept.
        pairs_same_order: fraction of calibration row pairs ordered as by FP32, with the
            move (``None``: not measured, or no pair-order constraint).

    """

    unit: str
    precision: str
    previous: str
    sensitivity: float
    bytes_saved: int
    ne: float | None
    delta_ne: float | None
    accepted: bool
    pairs_same_order: float | None = None


@dataclass
class SearchResult:
    """The chosen plan, the NE before and after, and every step in search order."""

    plan: QuantizationPlan
    ne_fp32: float
    ne: float
    steps: list[SearchStep] = field(default_factory=list)
    evaluations: int = 0

    def to_dict(self) -> dict:
        """JSON-able form (the report's ``search`` entry)."""
        return {
            "ne_fp32": self.ne_fp32,
            "ne": self.ne,
            "evaluations": self.evaluations,
            "order": [asdict(s) for s in self.steps],
        }


def ladder_of(
    unit: Unit,
    rows: int,
    dim: int,
    tiny_rows: int,
    interaction: bool = False,
    weights: int | None = None,
    tiny_weights: int = 0,
) -> tuple[tuple[str, ...], ...]:
    """The rungs ``unit`` may descend (a table of ``rows`` rows, a layer, an interaction).

    A Linear layer of at most ``tiny_weights`` ``weights`` stays FP32: its few bytes are
    not worth the time a low-precision twin adds per batch (FBGEMM's INT8 kernel quantizes
    each batch's activations first; bfloat16 casts them), slower than the FP32 product.
    """
    if unit.kind == "layer":
        if not interaction and weights is not None and weights <= tiny_weights:
            return ()
        if interaction:  # bf16 saves no bytes, and is slower than the compiled FP32 kernel
            return () if serving_kernels() is not None else INTERACTION_LADDER
        if importlib.util.find_spec("torchao"):
            return DENSE_LADDER
        # torchao's layers need the `serve` extra; FBGEMM's INT8 layer is in torch.
        return tuple(tuple(p for p in r if p not in TORCHAO_PRECISIONS) for r in DENSE_LADDER)
    if rows <= tiny_rows:
        return TINY_TABLE_LADDER
    return tuple(r for r in TABLE_LADDER if all(_packs(p, dim) for p in r))


def _packs(precision: str, dim: int) -> bool:
    try:
        Precision(precision).check_dim(dim)
    except ValueError:
        return False
    return True


class _Search:
    """State of one search (kept out of the public surface)."""

    def __init__(
        self,
        builder: ModelBuilder,
        rows: Rows,
        budget: float,
        tiny_rows: int,
        min_pairs: float | None = None,
        tiny_weights: int = 0,
    ) -> None:
        self.builder, self.rows, self.budget, self.min_pairs = builder, rows, budget, min_pairs
        source = builder.source
        self.fp32 = source.fp32_plan()
        cards = dict(zip(source.schema.field_names, source.schema.cardinalities, strict=True))
        dim = source.embedding_dim
        layers = dict(dense_layers(source.dense))
        products = {n for n, m in layers.items() if isinstance(m, DotInteraction)}
        weights = {n: m.weight.numel() for n, m in layers.items() if isinstance(m, nn.Linear)}
        self.ladders = {}
        for u in self.fp32.units():
            size = {"interaction": u.name in products, "weights": weights.get(u.name)}
            self.ladders[u] = ladder_of(u, cards.get(u.name, 0), dim, tiny_rows, **size,
                                        tiny_weights=tiny_weights)  # fmt: skip
        self.evaluations = 0
        self.logits_fp32 = logits_of(self.builder.build(self.fp32), rows)
        self.ne_fp32 = ne_of(self.logits_fp32, rows.label)

    def ne(self, plan: QuantizationPlan) -> float:
        return self.measure(plan)[0]

    def measure(self, plan: QuantizationPlan) -> tuple[float, float | None]:
        """Calibration NE of ``plan``, and its pair agreement with FP32 when constrained."""
        self.evaluations += 1
        logits = logits_of(self.builder.build(plan), self.rows)
        pairs = None if self.min_pairs is None else pair_agreement(self.logits_fp32, logits)
        return ne_of(logits, self.rows.label), pairs

    def within(self, delta: float | None, pairs: float | None) -> bool:
        """Whether a measured move keeps the NE budget (and the pair-order floor)."""
        if delta is None or abs(delta) > self.budget:
            return False
        return self.min_pairs is None or (pairs is not None and pairs >= self.min_pairs)

    def sensitivity(self, unit: Unit, precision: str) -> float:
        """NE change with ``unit`` alone at ``precision`` (infinite when it cannot be built).

        torchao's layers refuse some shapes (e.g. a Linear layer of one input feature).
        """
        try:
            return self.ne(self.fp32.with_precision(unit, precision)) - self.ne_fp32
        except (RuntimeError, ValueError) as e:
            log.warning("%s cannot run in %s (%s)", unit, precision, str(e).splitlines()[0])
            return math.inf

    def candidate(self, unit: Unit, rung: int, plan: QuantizationPlan) -> tuple | None:
        """Heap entry of ``unit``'s move to ``rung`` (``None`` past the ladder's end)."""
        if rung >= len(self.ladders[unit]):
            return None
        precision = self.ladders[unit][rung][0]
        sensitivity = self.sensitivity(unit, precision)
        saved = 0
        if math.isfinite(sensitivity):
            before = self.builder.unit_bytes(unit, plan.precision(unit))
            saved = before - self.builder.unit_bytes(unit, precision)
        return (abs(sensitivity) / max(saved, 1), str(unit), unit, rung, sensitivity, saved)


def search_plan(
    builder: ModelBuilder,
    rows: Rows,
    budget_ne: float,
    tiny_rows: int = 128,
    min_pair_agreement: float | None = None,
    tiny_weights: int = 4096,
) -> SearchResult:
    """Choose each table's and layer's precision under an NE budget (see the module doc).

    Args:
        builder: builds models of the trained FP32 model for any plan.
        rows: labeled calibration rows.
        budget_ne: largest allowed ``|NE(quantized) - NE(FP32)|`` on ``rows`` (> 0).
        tiny_rows: tables with at most this many rows only go down to FP16.
        min_pair_agreement: keep only moves whose model orders at least this fraction of
            calibration row pairs as FP32 does (``None``: no such constraint).
        tiny_weights: Linear layers with at most this many weights stay FP32 (faster there
            than FBGEMM's INT8 kernel, which quantizes each batch's activations first).

    Returns:
        The plan, NE before and after, and every step in the order tried.

    """
    budget = check_positive("quantize", "budget_ne", budget_ne)
    if min_pair_agreement is not None and not 0 < min_pair_agreement <= 1:
        raise ValueError(
            f"quantize: min_pair_agreement must be in (0, 1], got {min_pair_agreement}"
        )
    state = _Search(builder, rows, budget, tiny_rows, min_pair_agreement, tiny_weights)
    plan, ne = state.fp32, state.ne_fp32
    heap = [c for u in plan.units() if (c := state.candidate(u, 0, plan)) is not None]
    heapq.heapify(heap)
    steps: list[SearchStep] = []
    while heap:
        _, _, unit, rung, sensitivity, saved = heapq.heappop(heap)
        previous = plan.precision(unit)
        for i, precision in enumerate(state.ladders[unit][rung]):
            if i > 0:  # a same-size alternative has its own sensitivity
                sensitivity = state.sensitivity(unit, precision)
            trial = plan.with_precision(unit, precision)
            measured, pairs = state.measure(trial) if abs(sensitivity) <= budget else (None, None)
            delta = None if measured is None else measured - state.ne_fp32
            accepted = state.within(delta, pairs)
            steps.append(
                SearchStep(
                    str(unit),
                    precision,
                    previous,
                    sensitivity,
                    saved,
                    measured,
                    delta,
                    accepted,
                    pairs,
                )
            )
            log.info(
                "%-28s %-16s -> %-16s sensitivity %+.2e  NE change %s  %s",
                unit,
                previous,
                precision,
                sensitivity,
                "   n/a   " if delta is None else f"{delta:+.2e}",
                "kept" if accepted else "undone",
            )
            if accepted:
                plan, ne = trial, measured
                nxt = state.candidate(unit, rung + 1, plan)
                if nxt is not None:
                    heapq.heappush(heap, nxt)
                break
    return SearchResult(plan, state.ne_fp32, ne, steps, state.evaluations)
