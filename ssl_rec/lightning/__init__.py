"""LightningModules and callbacks composing backbones, objectives and heads."""

from ssl_rec.lightning.callbacks import MetricsJSON
from ssl_rec.lightning.checkpoint import (
    load_backbone_weights,
    load_module,
    read_checkpoint,
    schema_of,
)
from ssl_rec.lightning.ctr_module import CTRModule
from ssl_rec.lightning.knn_probe_callback import KNNProbeCallback
from ssl_rec.lightning.pretrain_module import PretrainModule

__all__ = [
    "CTRModule",
    "KNNProbeCallback",
    "MetricsJSON",
    "PretrainModule",
    "load_backbone_weights",
    "load_module",
    "read_checkpoint",
    "schema_of",
]
