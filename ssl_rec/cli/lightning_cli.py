"""``SSLRecCLI``: LightningCLI wired for ssl-rec.

Schema linking, W&B offline, ``metrics.json``, predictions files, run directories that
cannot mislead (:mod:`ssl_rec.cli.run_dir`) and data encoded with the vocabulary of the
checkpoint a command starts from (:mod:`ssl_rec.cli.checkpoint_args`).
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

from pytorch_lightning.cli import LightningArgumentParser, LightningCLI

from ssl_rec.cli.checkpoint_args import (
    checkpoint_defaults,
    checkpoint_vocabulary,
    option_value,
    vocabulary_source,
)
from ssl_rec.cli.datamodules import encoded_with
from ssl_rec.cli.environment import wandb_offline
from ssl_rec.cli.predict import predict_whole_files
from ssl_rec.cli.run_dir import check_fresh_run
from ssl_rec.lightning.callbacks import MetricsJSON
from ssl_rec.lightning.prediction_writer import PredictionWriter
from ssl_rec.vocabularies import Vocabularies


def _schema_dict(schema: Any) -> dict:
    return schema.to_dict() if hasattr(schema, "to_dict") else dict(schema)


class SSLRecCLI(LightningCLI):
    """LightningCLI wired for ssl-rec (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._checkpoint: tuple[str, dict] | None = None
        self._vocabulary: Vocabularies | None = None
        super().__init__(*args, **kwargs)

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """Parsers raise their errors, so ``ssl_rec.cli.errors`` can report them in one line."""
        kwargs.setdefault("exit_on_error", False)
        return super().init_parser(**kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Link the data's schema into the model; add the metrics and predictions writers."""
        parser.link_arguments(
            "data", "model.init_args.schema", compute_fn=self._data_schema, apply_on="instantiate"
        )
        parser.add_lightning_class_args(MetricsJSON, "metrics_json")
        parser.add_lightning_class_args(PredictionWriter, "predictions")

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse, with the model and data settings of ``--ckpt_path`` as defaults (if any)."""
        if not isinstance(args, list | tuple | None):
            return super().parse_arguments(parser, args)
        argv, checkpoint = checkpoint_defaults(sys.argv[1:] if args is None else args)
        if checkpoint is None:
            return super().parse_arguments(parser, args)
        self._checkpoint = (str(option_value(argv[1:], "ckpt_path")), checkpoint)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "LightningCLI's args parameter", UserWarning)
            return super().parse_arguments(parser, argv)

    def instantiate_classes(self) -> None:
        """Instantiate; an error raised while the data builds its schema surfaces as itself.

        jsonargparse wraps exceptions of a link's ``compute_fn`` (here: preprocessing the
        data) in a ``ValueError`` naming the link; the data's own message is the useful one.
        """
        try:
            super().instantiate_classes()
        except ValueError as e:
            if e.__cause__ is not None and str(e).startswith("Call to compute_fn of link"):
                raise e.__cause__ from None
            raise

    def _data_schema(self, datamodule: Any) -> dict:
        return _schema_dict(encoded_with(datamodule, self._vocabulary).schema)

    def before_instantiate_classes(self) -> None:
        """Check the run directory, pick the data's vocabulary and the run's output paths.

        W&B files and checkpoints go under the run's ``default_root_dir`` by default:
        otherwise checkpoints would land in a directory named after the W&B run id, which
        scripts cannot predict; here they are ``{default_root_dir}/checkpoints``.
        """
        config = self.config[self.subcommand] if self.subcommand else self.config
        self._set_output_dirs(config)
        if self.subcommand == "fit":
            check_fresh_run(config)
        if self.subcommand == "predict":
            predict_whole_files(config)
        source = vocabulary_source(self.subcommand, config)
        self._vocabulary = checkpoint_vocabulary(source, self._checkpoint) if source else None

    @staticmethod
    def _set_output_dirs(config: Any) -> None:
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
