"""KNNProbeCallback: a kNN CTR probe on frozen representations every N epochs."""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl

from ssl_rec._checks import check_at_least
from ssl_rec.evaluation.export import IndexConfig, export_embeddings
from ssl_rec.evaluation.knn_probe import knn_probe
from ssl_rec.evaluation.representations import compute_representations


class KNNProbeCallback(pl.Callback):
    """Log ``knn/auc`` and ``knn/logloss`` of a kNN probe (see ``ssl_rec.evaluation.knn_probe``).

    The neighbour bank is the data module's labeled ``val`` split's first ``bank_rows`` rows
    and the probed rows the next ``probe_rows`` ones, so the probe also works while
    pretraining on unlabeled training rows. Optionally exports the entity embeddings at
    the end of training to ``<default_root_dir>/embeddings`` and logs it as a W&B artifact
    (works offline).

    Args:
        every_n_epochs: run after every ``every_n_epochs``-th training epoch (>= 1).
        k: neighbours of the probe (>= 1).
        bank_rows: labeled rows whose representations are the neighbour bank.
        probe_rows: rows probed after the bank.
        log_artifact: export embeddings at train end and log them with ``wandb.Artifact``.
        export_fields: fields to export for the artifact (``None``: all).
    """

    def __init__(
        self,
        every_n_epochs: int = 1,
        k: int = 50,
        bank_rows: int = 10_000,
        probe_rows: int = 5_000,
        log_artifact: bool = False,
        export_fields: list[str] | None = None,
    ) -> None:
        super().__init__()
        for key, value in (
            ("every_n_epochs", every_n_epochs),
            ("k", k),
            ("bank_rows", bank_rows),
            ("probe_rows", probe_rows),
        ):
            check_at_least("KNNProbeCallback", key, value)
        self.every_n_epochs, self.k = every_n_epochs, k
        self.bank_rows, self.probe_rows = bank_rows, probe_rows
        self.log_artifact, self.export_fields = log_artifact, export_fields
        self.last: dict[str, float] | None = None

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Run the probe on the configured epochs and log its metrics."""
        if (trainer.current_epoch + 1) % self.every_n_epochs or trainer.sanity_checking:
            return
        datamodule = trainer.datamodule
        if datamodule is None:
            raise ValueError("KNNProbeCallback needs the trainer to have a datamodule")
        reps = compute_representations(
            pl_module, datamodule.val_dataloader(), self.bank_rows + self.probe_rows
        )
        if reps.labels is None or len(reps) <= self.bank_rows:
            raise ValueError(
                f"KNNProbeCallback needs more than bank_rows={self.bank_rows} labeled val rows, "
                f"got {len(reps)} (labeled: {reps.labels is not None})"
            )
        b = self.bank_rows
        self.last = knn_probe(
            reps.vectors[:b], reps.labels[:b], reps.vectors[b:], reps.labels[b:], self.k
        )
        pl_module.log_dict({f"knn/{k}": v for k, v in self.last.items()}, sync_dist=False)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Export the embeddings as a W&B artifact when ``log_artifact`` is set."""
        if not self.log_artifact or trainer.global_rank != 0:
            return
        import wandb

        run = getattr(trainer.logger, "experiment", None)
        if run is None or not hasattr(run, "log_artifact"):
            raise ValueError("KNNProbeCallback(log_artifact=True) needs a WandbLogger")
        out = export_embeddings(
            pl_module,
            None,
            Path(trainer.default_root_dir) / "embeddings",
            self.export_fields,
            config=IndexConfig(),
            overwrite=True,
            progress=False,
        )
        artifact = wandb.Artifact(f"embeddings-{run.id}", type="embeddings")
        artifact.add_dir(str(out))
        run.log_artifact(artifact)
