"""``SSLRecCLI``: LightningCLI wired for ssl-rec (schema linking, W&B offline, metrics.json)."""

from __future__ import annotations

import os
from typing import Any

from pytorch_lightning.cli import LightningArgumentParser, LightningCLI

from ssl_rec.cli.environment import wandb_offline
from ssl_rec.lightning.callbacks import MetricsJSON


def _schema_dict(schema: Any) -> dict:
    return schema.to_dict() if hasattr(schema, "to_dict") else dict(schema)


class SSLRecCLI(LightningCLI):
    """LightningCLI wired for ssl-rec: schema linking, W&B by default, metrics.json."""

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """Parsers raise their errors, so ``ssl_rec.cli.errors`` can report them in one line."""
        kwargs.setdefault("exit_on_error", False)
        return super().init_parser(**kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Link the data's feature schema into the model and add the metrics writer."""
        parser.link_arguments(
            "data.schema", "model.init_args.schema", compute_fn=_schema_dict, apply_on="instantiate"
        )
        parser.add_lightning_class_args(MetricsJSON, "metrics_json")

    def before_instantiate_classes(self) -> None:
        """Put W&B files and checkpoints under the run's ``default_root_dir`` by default.

        Without this, checkpoints would land in a directory named after the W&B run id,
        which scripts cannot predict; here they are ``{default_root_dir}/checkpoints``.
        """
        config = self.config[self.subcommand] if self.subcommand else self.config
        root = config.trainer.default_root_dir or "."
        for callback in config.trainer.get("callbacks") or []:
            init_args = getattr(callback, "init_args", None)
            if str(getattr(callback, "class_path", "")).endswith("ModelCheckpoint"):
                if init_args is not None and init_args.get("dirpath") is None:
                    init_args.dirpath = os.path.join(root, "checkpoints")
        logger = config.trainer.get("logger")
        init_args = getattr(logger, "init_args", None)
        if init_args is not None and str(logger.class_path).endswith("WandbLogger"):
            if init_args.get("save_dir") in (None, "."):
                init_args.save_dir = root
            os.makedirs(init_args.save_dir, exist_ok=True)


def trainer_defaults() -> dict[str, Any]:
    """Trainer defaults: W&B logger (offline by default), checkpoints on ``val/auc``."""
    return {
        "logger": {
            "class_path": "pytorch_lightning.loggers.WandbLogger",
            "init_args": {"project": "ssl-rec", "offline": wandb_offline()},
        },
    }
