"""Views: field masking and feature corruptions as batched, seeded tensor ops."""

from ssl_rec.views.corruption import (
    DenseNoise,
    FeatureSwap,
    IdDropout,
    dense_corruption,
    feature_swap,
    id_dropout,
)
from ssl_rec.views.masking import (
    CorrelatedFieldMask,
    RandomFieldMask,
    field_mutual_information,
    field_ranking,
    random_field_mask,
)
from ssl_rec.views.view import View, ViewOutput

__all__ = [
    "CorrelatedFieldMask",
    "DenseNoise",
    "FeatureSwap",
    "IdDropout",
    "RandomFieldMask",
    "View",
    "ViewOutput",
    "dense_corruption",
    "feature_swap",
    "field_mutual_information",
    "field_ranking",
    "id_dropout",
    "random_field_mask",
]
