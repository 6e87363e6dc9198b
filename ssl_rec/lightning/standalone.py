"""StandaloneModule: the checkpoint behaviour shared by every ssl-rec LightningModule."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl

from ssl_rec.lightning.artifact import adopt_data_vocabulary, restore_artifact, save_artifact
from ssl_rec.lightning.strategy import refuse_unsharded_tables


class StandaloneModule(pl.LightningModule):
    """A LightningModule with a ``backbone`` whose checkpoints stand alone.

    Its checkpoints carry the schema, the vocabulary, provenance and RNG states; data given
    to a trained module is encoded with the module's vocabulary; strategies that would
    replicate the embedding tables are refused. Subclasses set ``self.backbone``.
    """

    @property
    def vocabulary(self) -> Any:
        """The backbone's :class:`~ssl_rec.vocabularies.Vocabularies` (``None`` before any data)."""
        return self.backbone.vocabulary

    def setup(self, stage: str) -> None:
        """Refuse replicated tables; take the data's vocabulary or re-encode the data.

        Strategies that would replicate the tables are refused (see ``strategy``); a new
        model adopts its data's vocabulary, a trained one has the data encoded with its own.
        """
        refuse_unsharded_tables(self.trainer, self)
        adopt_data_vocabulary(self)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Store schema, vocabulary, provenance and RNG states: the checkpoint stands alone."""
        save_artifact(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore the vocabulary and provenance (and RNG states when resuming a fit)."""
        restore_artifact(self, checkpoint)
