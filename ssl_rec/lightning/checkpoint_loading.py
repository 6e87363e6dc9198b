"""Reading ssl-rec checkpoints: backbone weights for fine-tuning, vocabularies and whole modules."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import pytorch_lightning as pl
import torch

from ssl_rec.class_paths import allowed_classes, check_class_paths, resolve_class
from ssl_rec.distributed.dcp_checkpoint import (
    is_distributed_checkpoint,
    read_distributed_checkpoint,
)
from ssl_rec.evaluation.manifest import file_sha256
from ssl_rec.hardware.table_allocation import declared_state
from ssl_rec.lightning.checkpoint_checksums import verify_checksums
from ssl_rec.lightning.checkpoint_extras import SCHEMA_KEY, VOCABULARY_KEY
from ssl_rec.lightning.mapped_checkpoint import map_checkpoint_file
from ssl_rec.models.backbone import Backbone
from ssl_rec.schema import FeatureSchema
from ssl_rec.vocab import Vocabularies

BACKBONE_PREFIX = "backbone."
_EMBEDDING = "embedding."  # the tables and [MASK] tokens inside a backbone's state
# The configs a checkpoint rebuilds its module and data module from.
HPARAMS, DM_HPARAMS = "hyper_parameters", "datamodule_hyper_parameters"


def read_checkpoint(path: str | os.PathLike[str], mapped: bool = False) -> dict:
    """Load a Lightning checkpoint on CPU, with a clear error when it is missing or broken.

    A torch.distributed.checkpoint directory (written by ``ShardedTablesStrategy``) reads as
    the file one process would have written, with full tables. The per-tensor checksums a
    checkpoint records are verified (:mod:`ssl_rec.lightning.checkpoint_checksums`), and
    every class path in its configs must be allowed (:func:`check_checkpoint_classes`).

    With ``mapped``, a file's embedding tables are read-only views of the file
    (:func:`~ssl_rec.lightning.mapped_checkpoint.map_checkpoint_file`): loading them into a
    sharded or declared collection copies only the rows each process keeps. Do not write to
    them.

    Raises:
        FileNotFoundError: no checkpoint at ``path``.
        ValueError: the file is not a checkpoint, or a tensor differs from its checksum.
        UntrustedClassPath: a ``ValueError`` naming a class path outside the allow-list.
    """
    path = Path(path)
    if path.is_dir():  # refused with one line unless it holds the library's manifest
        return check_checkpoint_classes(read_distributed_checkpoint(path), str(path))
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        if mapped:
            checkpoint = map_checkpoint_file(path)
        else:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types for a corrupt file
        raise ValueError(f"{path}: not a readable checkpoint ({type(e).__name__}: {e})") from e
    verify_checksums(checkpoint, str(path))
    return check_checkpoint_classes(checkpoint, str(path))


def check_checkpoint_classes(
    checkpoint: dict, where: str, owner: type | None = None
) -> dict:  # fmt: skip
    """``checkpoint``, once every class path in its configs is allowed (checked, not imported).

    Args:
        checkpoint: a loaded checkpoint dict.
        where: its file, for the message.
        owner: the module class that will be built from ``hyper_parameters``, when known.

    Raises:
        UntrustedClassPath: a ``ValueError`` naming ``where``, the key path and the class
            path (:mod:`ssl_rec.class_paths`; ``ssl-rec --allow_class`` extends the list).

    """
    check_class_paths(checkpoint.get(HPARAMS), where, HPARAMS, owner)
    check_class_paths(checkpoint.get(DM_HPARAMS), where, DM_HPARAMS)
    return checkpoint


def check_checkpoint_file(
    path: str | os.PathLike[str] | IO[bytes], owner: type | None = None
) -> None:  # fmt: skip
    """Refuse checkpoint ``path`` when its configs name classes outside the allow-list.

    Reads the pickle only: a file's tensors are mapped read-only, not read (Lightning reads
    the file next, in ``load_from_checkpoint``).
    """
    if not isinstance(path, str | os.PathLike):  # a file object
        start = path.tell()
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        path.seek(start)
        check_checkpoint_classes(checkpoint, "checkpoint", owner)
        return
    try:
        checkpoint = map_checkpoint_file(path, writable=False)
    except Exception:  # noqa: BLE001 - not a zip file, missing, a directory: read it fully
        checkpoint = read_checkpoint(path)
    check_checkpoint_classes(checkpoint, str(path), owner)


def read_vocabulary(path: str | os.PathLike[str]) -> Vocabularies | None:
    """The vocabularies saved in checkpoint ``path``, or ``None`` if it has none.

    Example:
        >>> datamodule.use_vocabulary(read_vocabulary("pre.ckpt"))  # doctest: +SKIP

    """
    return vocabulary_of(read_checkpoint(path, mapped=True), str(path))


def vocabulary_of(checkpoint: Mapping[str, Any], where: str = "checkpoint") -> Vocabularies | None:
    """The vocabularies stored in a loaded checkpoint dict, or ``None``."""
    state = checkpoint.get(VOCABULARY_KEY)
    return None if state is None else Vocabularies.from_state(state, where)


def load_backbone_weights(
    backbone: Backbone, path: str | os.PathLike[str], schema: FeatureSchema | None = None,
    transfer: str = "backbone",
) -> dict[str, str]:  # fmt: skip
    """Load the ``backbone.*`` entries and the vocabulary of checkpoint ``path``.

    Tables load at any precision (:meth:`ssl_rec.models.Backbone.load_weights`). Rows are
    attached by raw value, never by position alone: when ``schema`` says which
    vocabularies its data was encoded with (``metadata["vocabulary"]``), they must be the
    checkpoint's.

    Declared tables (``ssl_rec.hardware.declare_tables``, as a sharded ``ssl-rec fit`` builds
    its model) are not allocated here: they keep the checkpoint's tables as pending values,
    read from the file by each process for the rows it owns once the strategy shards them
    (in one process, whole at their first use). Tables saved in another format than the
    model's are converted here, whole.

    ``transfer="tables"`` loads the embedding tables and ``[MASK]`` tokens only: the
    backbone keeps its own (fresh) encoder and dense statistics, which may then differ from
    the checkpoint's (another encoder class or size; ``embedding_dim`` must match).

    Returns:
        Provenance of the weights: ``{"file": name, "sha256": hex}``.

    Raises:
        ValueError: naming the checkpoint and the fields whose vocabularies or the dense
            columns that differ, or when the backbone differs (schema, dims, encoder).

    """
    checkpoint = read_checkpoint(path, mapped=True)  # tables stay in the file until sharded
    vocabulary = vocabulary_of(checkpoint, str(path))
    if schema is not None:
        _check_data_matches(checkpoint, vocabulary, schema, str(path))
    state = checkpoint.get("state_dict", {})
    weights = {
        k[len(BACKBONE_PREFIX) :]: v for k, v in state.items() if k.startswith(BACKBONE_PREFIX)
    }
    if not weights:
        raise ValueError(f"{path}: checkpoint has no '{BACKBONE_PREFIX}*' weights")
    if transfer == "tables":  # the rest stays this backbone's own
        with declared_state():  # declared tables stay unallocated
            own = backbone.state_dict()
        own = {k: v for k, v in own.items() if not k.startswith(_EMBEDDING)}
        weights = {**{k: v for k, v in weights.items() if k.startswith(_EMBEDDING)}, **own}
    elif transfer != "backbone":
        raise ValueError(f"transfer must be 'backbone' or 'tables', got {transfer!r}")
    fitted = backbone.dense_statistics_set
    backbone.load_weights(weights, where=str(path))
    if transfer == "tables" and not fitted:  # still to be taken from the data at setup
        backbone.set_dense_statistics(None)
    if vocabulary is not None:
        backbone.set_vocabulary(vocabulary)
    digest = file_sha256(path) if Path(path).is_file() else None  # a DCP checkpoint is a dir
    return {"file": Path(path).name, "sha256": digest}


def _check_data_matches(
    checkpoint: Mapping[str, Any], vocabulary: Vocabularies | None, schema: FeatureSchema,
    where: str,
) -> None:  # fmt: skip
    saved = checkpoint.get(SCHEMA_KEY)
    if saved is not None and list(saved.get("dense", [])) != list(schema.dense):
        raise ValueError(
            f"{where}: the model was trained on dense columns {list(saved['dense'])}, the "
            f"data has {list(schema.dense)}"
        )
    encoded_with = schema.metadata.get("vocabulary")
    if vocabulary is None or not isinstance(encoded_with, Mapping):
        return
    bad = vocabulary.disagreeing(encoded_with)
    if bad:
        raise ValueError(
            f"{where}: the data was encoded with other vocabularies than the checkpoint's in "
            f"fields {bad[:10]}, so its ids would pick other values' rows; encode the data "
            "with the checkpoint's vocabulary (ssl-rec fit --model.init_from does; in Python "
            f"datamodule.use_vocabulary(read_vocabulary({where!r})))"
        )


def schema_of(checkpoint: Mapping[str, Any]) -> dict:
    """The feature schema dict stored in a checkpoint by CTRModule or PretrainModule."""
    if SCHEMA_KEY in checkpoint:
        return dict(checkpoint[SCHEMA_KEY])
    hparams = checkpoint.get("hyper_parameters", {})
    if "schema" in hparams:
        return dict(hparams["schema"])
    raise ValueError("checkpoint holds no feature schema (not written by ssl-rec?)")


def load_module(
    path: str | os.PathLike[str], allow_classes: Sequence[str] = ()
) -> pl.LightningModule:  # fmt: skip
    """Rebuild the LightningModule saved in checkpoint ``path``.

    The module class is read from the checkpoint's hyperparameters (``_class_path``), so a
    pretraining or a CTR checkpoint, made by ``ssl-rec fit`` or from Python, both load;
    weights, embedding stores and the vocabulary are restored. Every class the checkpoint
    names must be an ssl-rec class or under ``allow_classes`` (:mod:`ssl_rec.class_paths`).

    Args:
        path: the checkpoint file (or sharded checkpoint directory).
        allow_classes: class paths or package prefixes of your own classes that the
            checkpoint may name (``["my_pkg"]``); only for files you trust.

    Raises:
        UntrustedClassPath: a ``ValueError`` naming a class path outside the allow-list.

    """
    with allowed_classes(allow_classes):
        checkpoint = read_checkpoint(path)
        class_path = checkpoint.get("hyper_parameters", {}).get("_class_path")
        if not class_path:
            raise ValueError(
                f"{path}: checkpoint has no '_class_path' hyperparameter; it was not written by "
                "an ssl-rec module (load it with YourModule.load_from_checkpoint instead)"
            )
        cls = resolve_class(class_path, str(path), "hyper_parameters._class_path")
        if not issubclass(cls, pl.LightningModule):
            raise ValueError(f"{path}: {class_path} is not a LightningModule")
        if is_distributed_checkpoint(path):  # Lightning reads files: hand it the full checkpoint
            buffer = io.BytesIO()
            torch.save(checkpoint, buffer)
            buffer.seek(0)
            return cls.load_from_checkpoint(buffer, map_location="cpu")
        return cls.load_from_checkpoint(path, map_location="cpu")
