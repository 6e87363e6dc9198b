"""LightningModules and callbacks composing backbones, objectives and heads."""

from ssl_rec.lightning.callbacks import MetricsJSON
from ssl_rec.lightning.checkpoint_loading import (
    load_backbone_weights,
    load_module,
    read_checkpoint,
    read_vocabulary,
    schema_of,
)
from ssl_rec.lightning.ctr_module import CTRModule
from ssl_rec.lightning.knn_probe_callback import KNNProbeCallback
from ssl_rec.lightning.pretrain_module import PretrainModule
from ssl_rec.lightning.quantization_monitor import QuantizationMonitor
from ssl_rec.lightning.retrieval_module import RetrievalModule
from ssl_rec.lightning.strategy import ShardedTablesStrategy, refuse_unsharded_tables

__all__ = [
    "CTRModule",
    "KNNProbeCallback",
    "MetricsJSON",
    "PretrainModule",
    "QuantizationMonitor",
    "RetrievalModule",
    "ShardedTablesStrategy",
    "load_backbone_weights",
    "load_module",
    "read_checkpoint",
    "read_vocabulary",
    "refuse_unsharded_tables",
    "schema_of",
]
