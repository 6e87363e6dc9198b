"""Models: field embeddings, interaction encoders (DLRM, DCNv2, DeepFM), heads and the Backbone."""

from ssl_rec.models.backbone import Backbone, as_schema, ema_update
from ssl_rec.models.cooccurrence_factors import CooccurrenceFactors
from ssl_rec.models.dcn import CrossLayer, DCNv2Encoder
from ssl_rec.models.deepfm import DeepFMEncoder, FMInteraction
from ssl_rec.models.dlrm import DLRMEncoder, DotInteraction
from ssl_rec.models.field_embedding import FieldEmbedding
from ssl_rec.models.heads import CTRHead
from ssl_rec.models.id_counts import IdCountFeatures
from ssl_rec.models.mlp import MLP
from ssl_rec.models.numeric_encoding import DENSE_ENCODINGS, DenseStandardizer
from ssl_rec.models.two_tower import TowerEncoder, TwoTowerModel, tower_schema
from ssl_rec.models.wide import WideTerm

__all__ = [
    "DENSE_ENCODINGS",
    "MLP",
    "Backbone",
    "CTRHead",
    "CooccurrenceFactors",
    "CrossLayer",
    "DCNv2Encoder",
    "DLRMEncoder",
    "DeepFMEncoder",
    "DenseStandardizer",
    "DotInteraction",
    "FMInteraction",
    "FieldEmbedding",
    "IdCountFeatures",
    "TowerEncoder",
    "TwoTowerModel",
    "WideTerm",
    "as_schema",
    "ema_update",
    "tower_schema",
]
