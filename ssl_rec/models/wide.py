"""The wide (linear) part of Wide & Deep: one learned scalar per id, plus a linear dense term.

Cheng et al., "Wide & Deep Learning for Recommender Systems", DLRS 2016,
https://arxiv.org/abs/1606.07792. What logistic regression on one-hot ids learns, added to
the deep model's logit, so that the deep model need not rediscover it from few labels;
optionally with a slope per field on how often the id occurs in the training rows
(:class:`~ssl_rec.models.id_counts.IdCountFeatures`) and slopes on low-rank factors of two
fields' co-occurrence (:class:`~ssl_rec.models.cooccurrence_factors.CooccurrenceFactors`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, Precision, TableSpec
from ssl_rec.models.cooccurrence_factors import CooccurrenceFactors
from ssl_rec.models.id_counts import IdCountFeatures

__all__ = [
    "WideTerm",
    "default_factor_fields",
    "hold_wide_term",
    "wide_table_spec",
    "wide_term",
]

_FLOAT_FORMATS = (Precision.fp32, Precision.fp16, Precision.bf16)


def wide_table_spec(spec: TableSpec) -> TableSpec:
    """The spec of a field's one-column wide table, given its embedding table's spec.

    The optimizer, learning rate, weight decay, stochastic rounding and store directory are
    kept; FP16 and BF16 stay. Integer formats become FP32: a one-column row of theirs holds
    the value in its scale and bias (INT8: 9 bytes, more than FP32's 4; INT4 and INT2 round
    their FP16 bias down on every write, a drift a scalar would feel).

    Args:
        spec: the embedding table's spec.

    Returns:
        The wide table's spec (no cache: a scalar row is smaller than a cache slot's tag).
    """
    precision = spec.precision if spec.precision in _FLOAT_FORMATS else Precision.fp32
    return dataclasses.replace(spec, precision=precision, cache_fraction=0.0)


class WideTerm(nn.Module):
    """``sum_f w_f[id_f] + <v, dense> (+ <u, counts>) (+ <t, factors>)``: a linear model.

    The scalars live in the library's own tables (one column each, zero at the start), so
    they train with the fused sparse optimizer of their field's :class:`TableSpec` (see
    :func:`wide_table_spec`) and are saved with the module's ``state_dict``; the dense
    weights (zero at the start, no bias: the head has one) train with the dense optimizer.

    Args:
        field_names: names of the ``F`` fields (the tables' names).
        cardinalities: ids per field.
        n_dense: number of dense features (0: no dense term).
        specs: one embedding spec per field (or one for all), mapped by
            :func:`wide_table_spec`.
        seed: stochastic-rounding seed of the tables.
        id_counts: add ``sum_f u_f * count_f(id_f)``, a slope per field on the id's
            standardized log count in the training rows (:attr:`counts`, set before training
            with :meth:`IdCountFeatures.set_counts`); ``u`` starts at zero and trains with
            the dense optimizer.
        factor_rank: ``K > 0`` adds ``<t, factors(id_a, id_b)>``, slopes on the ``2K``
            standardized SVD factors of how often fields ``a`` and ``b``'s ids occur
            together (:attr:`factors`, set before training with
            :meth:`CooccurrenceFactors.set_counts`); ``t`` starts at zero like ``u``.
        factor_fields: the field indices ``(a, b)`` (needed with ``factor_rank``).

    Shape:
        ``sparse int64[B, F]``, ``dense float32[B, n_dense]`` -> ``float32[B]``.

    Example:
        >>> wide = WideTerm(["user"], [10], 1)
        >>> wide(torch.tensor([[3], [4]]), torch.ones(2, 1)).tolist()
        [0.0, 0.0]

    """

    def __init__(
        self,
        field_names: Sequence[str],
        cardinalities: Sequence[int],
        n_dense: int,
        specs: Sequence[TableSpec] | TableSpec | None = None,
        seed: int = 0,
        id_counts: bool = False,
        factor_rank: int = 0,
        factor_fields: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        if n_dense < 0:
            raise ValueError(f"WideTerm.n_dense must be >= 0, got {n_dense}")
        if specs is None or isinstance(specs, TableSpec):
            specs = [specs or TableSpec()] * len(cardinalities)
        if len(specs) != len(cardinalities):
            raise ValueError(f"WideTerm: {len(specs)} specs for {len(cardinalities)} fields")
        self.ids = MixedPrecisionEmbeddingCollection(
            list(cardinalities),
            1,
            [wide_table_spec(s) for s in specs],
            seed=seed,
            init_std=0.0,
            table_names=list(field_names),
        )
        self.dense = nn.Linear(n_dense, 1, bias=False) if n_dense else None
        if self.dense is not None:
            nn.init.zeros_(self.dense.weight)
        self.counts = IdCountFeatures(cardinalities) if id_counts else None
        self.count_weight = nn.Linear(len(cardinalities), 1, bias=False) if id_counts else None
        if factor_rank < 0:
            raise ValueError(f"WideTerm.factor_rank must be >= 0, got {factor_rank}")
        if factor_rank and factor_fields is None:
            raise ValueError("WideTerm.factor_rank needs factor_fields, the two fields' indices")
        self.factors = (
            CooccurrenceFactors(cardinalities, factor_fields, factor_rank, seed=seed)
            if factor_rank
            else None
        )
        self.factor_weight = (
            nn.Linear(self.factors.width, 1, bias=False) if self.factors is not None else None
        )
        for linear in (self.count_weight, self.factor_weight):
            if linear is not None:
                nn.init.zeros_(linear.weight)

    def linear_maps(self) -> list[nn.Linear]:
        """The dense linear maps the term has, in :meth:`linear_columns`' order.

        The dense weights, the count slopes and the factor slopes.
        """
        maps = (self.dense, self.count_weight, self.factor_weight)
        return [linear for linear in maps if linear is not None]

    def linear_columns(self, sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """The columns of the dense linear maps, ``float32[B, *]``.

        ``[dense, counts(sparse), factors(sparse)]`` (those the term has): what a logistic
        regression of this term fits beside the one-hot ids.
        """
        columns = [dense.float()]
        for features in (self.counts, self.factors):
            if features is not None:
                columns.append(features(sparse))
        return columns[0] if len(columns) == 1 else torch.cat(columns, dim=1)

    @torch.no_grad()
    def load_linear_weights(self, weights: torch.Tensor) -> None:
        """Set the dense weights, count and factor slopes from one weight per column.

        ``weights float[*]`` follow :meth:`linear_columns`' columns, in their order.
        """
        maps = self.linear_maps()
        parts = weights.split([linear.in_features for linear in maps])
        for linear, part in zip(maps, parts, strict=True):
            linear.weight.copy_(part.reshape(1, -1))

    def forward(self, sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """The wide logit of each row; see the class docstring for shapes."""
        logit = self.ids(sparse).sum(dim=(1, 2))
        if self.dense is not None:
            logit = logit + self.dense(dense).squeeze(-1)
        if self.count_weight is not None:
            logit = logit + self.count_weight(self.counts(sparse)).squeeze(-1)
        if self.factor_weight is not None:
            logit = logit + self.factor_weight(self.factors(sparse)).squeeze(-1)
        return logit


def default_factor_fields(cardinalities: Sequence[int]) -> tuple[int, int] | None:
    """The two fields with the most ids (users and items, in a recommender's logs).

    Ties go to the earlier field; the pair comes in the fields' order. ``None`` for a table
    of one field: there is no pair.
    """
    if len(cardinalities) < 2:
        return None
    order = sorted(range(len(cardinalities)), key=lambda f: (-int(cardinalities[f]), f))
    a, b = sorted(order[:2])
    return a, b


def wide_term(
    backbone: nn.Module,
    id_counts: bool = False,
    factor_rank: int = 0,
    factor_fields: Sequence[str] | None = None,
) -> WideTerm:
    """The :class:`WideTerm` of a :class:`~ssl_rec.models.Backbone`'s fields and dense columns.

    Each field's wide table follows that field's own table spec (overrides included);
    ``id_counts`` adds the count slopes, ``factor_rank`` the co-occurrence factors of the two
    named ``factor_fields`` (default: :func:`default_factor_fields`; none where the schema has
    one field and names none).

    Raises:
        ValueError: ``factor_fields`` not two different fields of the schema.

    """
    schema = backbone.schema
    names = list(schema.field_names)
    pair = None
    if factor_rank:
        if factor_fields is None:
            pair = default_factor_fields(schema.cardinalities)
        else:
            unknown = [n for n in factor_fields if n not in names]
            if len(factor_fields) != 2 or unknown or factor_fields[0] == factor_fields[1]:
                raise ValueError(
                    f"wide_factor_fields must name two different fields of {names}, "
                    f"got {list(factor_fields)}"
                )
            pair = (names.index(factor_fields[0]), names.index(factor_fields[1]))
    return WideTerm(
        names, schema.cardinalities, schema.n_dense, backbone.table_specs,
        id_counts=id_counts, factor_rank=factor_rank if pair else 0, factor_fields=pair,
    )  # fmt: skip


def hold_wide_term(wide: WideTerm) -> None:
    """Keep ``wide``'s weights as they are while the rest trains (frozen tables, no grad)."""
    wide.ids.frozen = True
    for linear in wide.linear_maps():
        linear.requires_grad_(False)
