"""Self-supervised objectives: ``forward(batch, backbone) -> ObjectiveOutput``.

YAML names them by ``class_path`` (``ssl_rec.objectives.InfoNCE``); this ``__all__`` is
the registry.
"""

from ssl_rec.objectives.adversarial_feature_replacement import AdversarialFeatureReplacement
from ssl_rec.objectives.base import Objective
from ssl_rec.objectives.complementary_info_nce import ComplementaryInfoNCE
from ssl_rec.objectives.contrastive import ProjectionHead, nt_xent
from ssl_rec.objectives.field_regularizers import (
    FeatureAlignment,
    FieldUniformity,
    feature_alignment_loss,
    field_uniformity_loss,
)
from ssl_rec.objectives.info_nce import InfoNCE
from ssl_rec.objectives.item_frequency import StreamingItemFrequency, counts_log_q
from ssl_rec.objectives.masked_dense_reconstruction import MaskedDenseReconstruction
from ssl_rec.objectives.masked_feature_prediction import MaskedFeaturePrediction
from ssl_rec.objectives.momentum_contrast import MomentumContrast
from ssl_rec.objectives.replaced_feature_detection import ReplacedFeatureDetection
from ssl_rec.objectives.sampled_softmax import SampledSoftmax, mixed_log_q

__all__ = [
    "AdversarialFeatureReplacement",
    "ComplementaryInfoNCE",
    "FeatureAlignment",
    "FieldUniformity",
    "InfoNCE",
    "MaskedDenseReconstruction",
    "MaskedFeaturePrediction",
    "MomentumContrast",
    "Objective",
    "ProjectionHead",
    "ReplacedFeatureDetection",
    "SampledSoftmax",
    "StreamingItemFrequency",
    "counts_log_q",
    "feature_alignment_loss",
    "field_uniformity_loss",
    "mixed_log_q",
    "nt_xent",
]
