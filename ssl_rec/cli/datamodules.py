"""The data a command reads: a ``--data`` module, else the one a checkpoint recorded."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.cli import instantiate_module

from ssl_rec.lightning.checkpoint_loading import read_checkpoint

DM_HPARAMS = "datamodule_hyper_parameters"


def datamodule_from(
    ckpt: str,
    data: pl.LightningDataModule | None,
    module: pl.LightningModule | None = None,
    use_labels: bool | None = None,
) -> pl.LightningDataModule:
    """Return ``data`` if given, else the data module rebuilt from the checkpoint.

    ``use_labels`` overrides the recorded setting (a pretraining run read its training rows
    without labels; probes need them). Given ``module`` (the checkpoint's model), the data
    is encoded with its vocabulary.
    """
    if data is None:
        data = recorded_datamodule(read_checkpoint(ckpt).get(DM_HPARAMS), ckpt, use_labels)
    return encoded_with(data, getattr(module, "vocabulary", None))


def encoded_with(data: pl.LightningDataModule, vocabulary: Any) -> pl.LightningDataModule:
    """``data``, set to encode its rows with a trained model's ``vocabulary`` when it can."""
    if vocabulary is not None and callable(getattr(data, "use_vocabulary", None)):
        data.use_vocabulary(vocabulary)
    return data


def check_recorded(hparams: dict[str, Any] | None, where: str) -> dict[str, Any]:
    """``hparams`` when they record a data module (``ValueError`` naming ``where`` if not)."""
    if not hparams or "_class_path" not in hparams:
        raise ValueError(
            f"{where}: records no data module; pass --data (e.g. "
            "--data.class_path ssl_rec.data.SyntheticCTRDataModule)"
        )
    return hparams


def recorded_datamodule(
    hparams: dict[str, Any] | None, where: str, use_labels: bool | None = None
) -> pl.LightningDataModule:
    """The data module whose constructor arguments ``hparams`` were recorded (by ``fit``).

    Raises:
        ValueError: naming ``where`` when nothing usable was recorded.

    """
    hparams = dict(check_recorded(hparams, where))
    if use_labels is not None and "use_labels" in hparams:
        hparams["use_labels"] = use_labels
    # The semi-supervised batch mix is a training setting: a command reading a split back
    # (probes, calibration, export) gets its labeled rows, never NaN-labeled ones.
    if hparams.get("unlabeled_per_batch"):
        hparams["unlabeled_per_batch"] = 0.0
    return instantiate_module(pl.LightningDataModule, hparams)


def split_loader(datamodule: pl.LightningDataModule, split: str) -> Any:
    """Return the data module's loader of ``split`` (``train``, ``val`` or ``test``)."""
    loaders = {"train": "train_dataloader", "val": "val_dataloader", "test": "test_dataloader"}
    if split not in loaders:
        raise ValueError(f"split must be one of {sorted(loaders)}, got {split!r}")
    datamodule.prepare_data()
    datamodule.setup("fit" if split != "test" else "test")
    return getattr(datamodule, loaders[split])()
