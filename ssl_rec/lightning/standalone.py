"""StandaloneModule: the checkpoint behaviour shared by every ssl-rec LightningModule."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Self

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.model_helpers import _restricted_classmethod

from ssl_rec.class_paths import allowed_classes
from ssl_rec.lightning.checkpoint_extras import (
    adopt_data_dense_statistics,
    adopt_data_vocabulary,
    restore_artifact,
    save_artifact,
)
from ssl_rec.lightning.checkpoint_loading import (
    check_checkpoint_classes,
    check_checkpoint_file,
    read_checkpoint,
)
from ssl_rec.lightning.strategy import refuse_unsharded_tables


class StandaloneModule(pl.LightningModule):
    """A LightningModule with a ``backbone`` whose checkpoints stand alone.

    Its checkpoints carry the schema, the vocabulary, provenance and RNG states; data given
    to a trained module is encoded with the module's vocabulary; strategies that would
    replicate the embedding tables are refused. Subclasses set ``self.backbone``.
    ``load_from_checkpoint`` builds only the classes an allow-list trusts.
    """

    @_restricted_classmethod  # as Lightning's: calling it on an instance is a TypeError
    def load_from_checkpoint(
        cls,
        checkpoint_path: str | os.PathLike[str] | IO[bytes],
        *args: Any,
        allow_classes: Sequence[str] = (),
        **kwargs: Any,
    ) -> Self:
        """Lightning's ``load_from_checkpoint``, once the checkpoint's class paths are allowed.

        The hyperparameters are the constructor's arguments, and class paths in them are
        imported and built: each must be an ssl-rec class or under ``allow_classes``
        (:mod:`ssl_rec.class_paths`), checked before anything is built.

        Args:
            checkpoint_path: the checkpoint file, a sharded checkpoint directory
                (read whole, in this process), or an open binary file.
            *args: Lightning's ``map_location``, ``hparams_file``, ``strict``, ...
            allow_classes: class paths or package prefixes of your own classes that the
                checkpoint may name (``["my_pkg"]``); only for files you trust.
            **kwargs: Lightning's keyword arguments and hyperparameter overrides.

        Raises:
            UntrustedClassPath: a ``ValueError`` naming the class path outside the allow-list.

        """
        with allowed_classes(allow_classes):
            if isinstance(checkpoint_path, str | os.PathLike) and Path(checkpoint_path).is_dir():
                # a sharded checkpoint directory: Lightning reads files, so hand it the
                # checkpoint as one (read and checked here, as load_module does)
                checkpoint = read_checkpoint(checkpoint_path)
                check_checkpoint_classes(checkpoint, str(checkpoint_path), owner=cls)
                buffer = io.BytesIO()
                torch.save(checkpoint, buffer)
                del checkpoint
                buffer.seek(0)
                return super().load_from_checkpoint(buffer, *args, **kwargs)
            check_checkpoint_file(checkpoint_path, owner=cls)
            return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

    @property
    def vocabulary(self) -> Any:
        """The backbone's :class:`~ssl_rec.vocab.Vocabularies` (``None`` before any data)."""
        return self.backbone.vocabulary

    def setup(self, stage: str) -> None:
        """Refuse replicated tables; take the data's vocabulary or re-encode the data.

        Strategies that would replicate the tables are refused (see ``strategy``); a new
        model adopts its data's vocabulary (and dense statistics), a trained one has the data
        encoded with its own (and standardizes it with its own statistics).
        """
        refuse_unsharded_tables(self.trainer, self)
        adopt_data_vocabulary(self)
        adopt_data_dense_statistics(self)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Store schema, vocabulary, provenance and RNG states: the checkpoint stands alone."""
        save_artifact(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore the vocabulary and provenance (and RNG states when resuming a fit)."""
        restore_artifact(self, checkpoint)
