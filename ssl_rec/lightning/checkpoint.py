"""Reading ssl-rec checkpoints: backbone weights for fine-tuning and whole modules."""

from __future__ import annotations

import importlib
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.core.mixins.hparams_mixin import _given_hyperparameters

from ssl_rec.distributed.checkpoint import is_distributed_checkpoint, read_distributed_checkpoint
from ssl_rec.models.backbone import Backbone

BACKBONE_PREFIX = "backbone."


def read_checkpoint(path: str | os.PathLike[str]) -> dict:
    """Load a Lightning checkpoint on CPU, with a clear error when it is missing or broken.

    A torch.distributed.checkpoint directory (written by ``ShardedTablesStrategy``) reads as
    the file one process would have written, with full tables.
    """
    path = Path(path)
    if is_distributed_checkpoint(path):
        return read_distributed_checkpoint(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types for a corrupt file
        raise ValueError(f"{path}: not a readable checkpoint ({type(e).__name__}: {e})") from e


def load_backbone_weights(backbone: Backbone, path: str | os.PathLike[str]) -> None:
    """Load the ``backbone.*`` entries of checkpoint ``path`` (tables at any precision).

    See :meth:`ssl_rec.models.Backbone.load_weights`; raises ``ValueError`` naming the
    checkpoint when the backbone differs (schema, dims, encoder).
    """
    state = read_checkpoint(path).get("state_dict", {})
    weights = {
        k[len(BACKBONE_PREFIX) :]: v for k, v in state.items() if k.startswith(BACKBONE_PREFIX)
    }
    if not weights:
        raise ValueError(f"{path}: checkpoint has no '{BACKBONE_PREFIX}*' weights")
    backbone.load_weights(weights, where=str(path))


def schema_of(checkpoint: Mapping[str, Any]) -> dict:
    """The feature schema dict stored in a checkpoint by CTRModule or PretrainModule."""
    if "feature_schema" in checkpoint:
        return dict(checkpoint["feature_schema"])
    hparams = checkpoint.get("hyper_parameters", {})
    if "schema" in hparams:
        return dict(hparams["schema"])
    raise ValueError("checkpoint holds no feature schema (not written by ssl-rec?)")


def load_module(path: str | os.PathLike[str]) -> pl.LightningModule:
    """Rebuild the LightningModule saved in checkpoint ``path`` (CLI-made checkpoints).

    The module class is read from the checkpoint's hyperparameters (``_class_path``), so a
    pretraining or a CTR checkpoint both load; weights and embedding stores are restored.
    """
    checkpoint = read_checkpoint(path)
    class_path = checkpoint.get("hyper_parameters", {}).get("_class_path")
    if not class_path:
        raise ValueError(
            f"{path}: checkpoint has no '_class_path' hyperparameter; it was not written by "
            "`ssl-rec fit` (load it with YourModule.load_from_checkpoint instead)"
        )
    module_name, _, class_name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, pl.LightningModule)):
        raise ValueError(f"{path}: {class_path} is not a LightningModule")
    if is_distributed_checkpoint(path):  # Lightning reads files: hand it the full checkpoint
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        buffer.seek(0)
        return cls.load_from_checkpoint(buffer, map_location="cpu")
    return cls.load_from_checkpoint(path, map_location="cpu")


def unpicklable_hparams(*names: str) -> list[str]:
    """Hyperparameters to leave out of a checkpoint when a module is built from Python.

    The CLI hands ``save_hyperparameters`` its config (plain values, enough for
    :func:`load_module` to rebuild the module); from Python the factories and modules in
    ``names`` would be pickled and break ``torch.load(weights_only=True)``, so they are
    ignored. Pass the result as ``save_hyperparameters(ignore=...)``.
    """
    return [] if _given_hyperparameters.get() is not None else list(names)
