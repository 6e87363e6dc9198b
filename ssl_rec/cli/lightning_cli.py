"""``SSLRecCLI``: LightningCLI wired for ssl-rec.

Schema linking, W&B offline, ``metrics.json``, predictions files, run directories that
cannot mislead (:mod:`ssl_rec.cli.run_dir`), one place per run for a command's outputs and
W&B run (:mod:`ssl_rec.cli.run_outputs`) and data encoded with the vocabulary of the
checkpoint a command starts from (:mod:`ssl_rec.cli.checkpoint_args`).
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from pytorch_lightning.cli import LightningArgumentParser, LightningCLI

from ssl_rec.cli.allow_class_option import ALLOW_HELP
from ssl_rec.cli.checkpoint_args import (
    checkpoint_defaults,
    checkpoint_vocabulary,
    ckpt_path_checkpoint,
    option_value,
    recorded_dense_transforms,
    vocabulary_source,
)
from ssl_rec.cli.datamodules import encoded_with
from ssl_rec.cli.environment import wandb_offline
from ssl_rec.cli.errors import disk_full_names
from ssl_rec.cli.fit_guard import FitGuard
from ssl_rec.cli.named_checkpoints import CKPT_PATH_HELP, resolve_named_checkpoint
from ssl_rec.cli.predict import data_reporting, predict_whole_files, use_recorded_dense_transforms
from ssl_rec.cli.progress_lines import plain_progress_callbacks
from ssl_rec.cli.run_dir import checkpoint_dirs, is_checkpoint_callback
from ssl_rec.cli.run_outputs import (
    OUTPUT_COMMANDS,
    OVERWRITE_HELP,
    drop_deprecated_wandb_settings,
    finish_wandb_run,
    place_outputs,
    set_wandb_run,
)
from ssl_rec.cli.table_declaration import model_tables
from ssl_rec.lightning.callbacks import MetricsJSON
from ssl_rec.lightning.durable_checkpoint_io import remove_stale_checkpoint_temporaries
from ssl_rec.lightning.finite_checks import FiniteChecks
from ssl_rec.lightning.prediction_writer import PredictionWriter
from ssl_rec.lightning.schedule_log import ScheduleLog
from ssl_rec.lightning.sharded_checkpoint_io import read_sharded_checkpoints
from ssl_rec.vocab import Vocabularies


def _schema_dict(schema: Any) -> dict:
    return schema.to_dict() if hasattr(schema, "to_dict") else dict(schema)


class SSLRecCLI(LightningCLI):
    """LightningCLI wired for ssl-rec (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._checkpoint: tuple[str, dict] | None = None
        self._argv: list[str] = []  # the command line, for options given on it
        self._vocabulary: Vocabularies | None = None
        self._fit_guard = FitGuard()
        try:
            super().__init__(*args, **kwargs)
        finally:
            self._fit_guard.release()  # the run directory is free once the command ends

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """Parsers raise their errors, so ``ssl_rec.cli.errors`` can report them in one line."""
        kwargs.setdefault("exit_on_error", False)
        kwargs.setdefault("epilog", ALLOW_HELP)
        return super().init_parser(**kwargs)

    def _prepare_subcommand_parser(
        self, klass: type, subcommand: str, **kwargs: Any
    ) -> LightningArgumentParser:
        """The subcommand's parser; ``--ckpt_path`` says which file is the run's best model."""
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        for action in parser._actions:
            if action.dest == "ckpt_path" and subcommand in CKPT_PATH_HELP:
                action.help = CKPT_PATH_HELP[subcommand]
        if subcommand in OUTPUT_COMMANDS:
            parser.add_argument("--overwrite", type=bool, default=False, help=OVERWRITE_HELP)
        return parser

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Link the data's schema into the model; add the metrics and predictions writers.

        :class:`FiniteChecks` is on for every run: ``fit`` stops on a non-finite loss or weight.
        """
        parser.link_arguments(
            "data", "model.init_args.schema", compute_fn=self._data_schema, apply_on="instantiate"
        )
        parser.add_lightning_class_args(MetricsJSON, "metrics_json")
        parser.add_lightning_class_args(PredictionWriter, "predictions")
        parser.add_lightning_class_args(FiniteChecks, "finite_checks")

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse, with the model and data settings of ``--ckpt_path`` as defaults (if any)."""
        if isinstance(args, list | tuple | None):
            self._argv = [str(a) for a in (sys.argv[1:] if args is None else args)]
        if not isinstance(args, list | tuple | None):
            return super().parse_arguments(parser, args)
        argv, checkpoint = checkpoint_defaults(sys.argv[1:] if args is None else args)
        if checkpoint is None:
            return super().parse_arguments(parser, args)
        self._checkpoint = (str(option_value(argv[1:], "ckpt_path")), checkpoint)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "LightningCLI's args parameter", UserWarning)
            return super().parse_arguments(parser, argv)

    def _parse_ckpt_path(self) -> None:
        """Resuming a fit runs the command's config (checked against the checkpoint's later).

        LightningCLI would replace the command's model settings with the checkpoint's here.
        """
        subcommand = self.config.get("subcommand")
        if subcommand != "fit":
            if subcommand:  # best / last: files of the run directory (Lightning: same process)
                resolve_named_checkpoint(self.config[subcommand], subcommand)
            # read first: a checkpoint naming classes outside the allow-list is refused
            # before LightningCLI parses (imports) its hyperparameters
            self._checkpoint = ckpt_path_checkpoint(self.config, self._checkpoint)
            self._apply_checkpoint_hparams()
            if subcommand:  # beside the checkpoint's run; refused before anything is set up
                place_outputs(subcommand, self.config[subcommand], self._argv)

    def _apply_checkpoint_hparams(self) -> None:
        """LightningCLI's ``_parse_ckpt_path`` on the checkpoint already read.

        Lightning's own would ``torch.load`` the whole file once more; it applies only to a
        checkpoint file, as here.
        """
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not ckpt_path or not Path(str(ckpt_path)).is_file():
            return
        if self._checkpoint is None or self._checkpoint[0] != str(ckpt_path):
            return super()._parse_ckpt_path()  # not read here: Lightning reads it
        hparams = dict(self._checkpoint[1].get("hyper_parameters") or {})
        hparams.pop("_instantiator", None)
        if not hparams:
            return None
        if "_class_path" in hparams:
            hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
        try:
            self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)
        except SystemExit:
            sys.stderr.write("Parsing of ckpt_path hyperparameters failed!\n")
            raise
        return None

    def after_instantiate_classes(self) -> None:
        """Refuse resuming with structural changes; log the other changes."""
        drop_deprecated_wandb_settings(self.trainer)
        if self.subcommand == "fit":
            self._fit_guard.after_instantiate(self.model, self.datamodule, self.trainer)
            self._checkpoint = None  # the trainer reads it again; do not hold it during the fit

    def _run_subcommand(self, subcommand: str) -> None:
        """Run; a full disk names the run directory (checkpoints, logs, metrics go there)."""
        config = self.config[subcommand]
        failed = True
        try:
            with disk_full_names(config.trainer.default_root_dir or "."):
                super()._run_subcommand(subcommand)
            failed = False
        finally:
            finish_wandb_run(getattr(self, "trainer", None), failed)

    def instantiate_classes(self) -> None:
        """Instantiate; an error raised while the data builds its schema surfaces as itself.

        jsonargparse wraps exceptions of a link's ``compute_fn`` (here: preprocessing the
        data) in a ``ValueError`` naming the link; the data's own message is the useful one.
        The trainer also loads sharded checkpoint directories in one process. Under the
        sharded strategy the model's tables are declared, not allocated: each rank allocates
        its rows when the strategy shards them (:mod:`ssl_rec.cli.table_declaration`).
        """
        config = self.config[self.subcommand] if self.subcommand else self.config
        try:
            with model_tables(config):
                super().instantiate_classes()
        except ValueError as e:
            if e.__cause__ is not None and str(e).startswith("Call to compute_fn of link"):
                raise e.__cause__ from None
            raise
        read_sharded_checkpoints(self.trainer)

    def _data_schema(self, datamodule: Any) -> dict:
        with data_reporting(self.subcommand):  # a predict run's rows are "predicting"
            return _schema_dict(encoded_with(datamodule, self._vocabulary).schema)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Any:
        """The trainer; its progress is plain lines when the output is not a terminal.

        :class:`ScheduleLog` says the fit's batch size, optimizer steps per epoch and why it
        stopped.
        """
        plain = plain_progress_callbacks(config, callbacks)
        return super()._instantiate_trainer(config, [*callbacks, ScheduleLog(), *plain])

    def before_instantiate_classes(self) -> None:
        """Check the run directory, pick the data's vocabulary and the run's output paths.

        W&B files and checkpoints go under the run's ``default_root_dir`` by default:
        otherwise checkpoints would land in a directory named after the W&B run id, which
        scripts cannot predict; here they are ``{default_root_dir}/checkpoints``.
        """
        config = self.config[self.subcommand] if self.subcommand else self.config
        self._set_output_dirs(config)
        if self.subcommand == "fit":
            resumed = self._fit_guard.before_instantiate(self._parser("fit"), config)
            self._checkpoint = resumed or self._checkpoint
            for directory in checkpoint_dirs(config):
                remove_stale_checkpoint_temporaries(directory)  # of writers killed earlier
        set_wandb_run(self.subcommand, config)  # after the guard: a refused fit records nothing
        self._make_logger_dir(config)
        if self.subcommand == "predict":
            predict_whole_files(config)
        source = vocabulary_source(self.subcommand, config)
        self._vocabulary = checkpoint_vocabulary(source, self._checkpoint) if source else None
        if source and self.subcommand != "fit":  # scoring: rows transformed as the model's
            use_recorded_dense_transforms(
                config, recorded_dense_transforms(source, self._checkpoint)
            )

    @staticmethod
    def _set_output_dirs(config: Any) -> None:
        root = config.trainer.default_root_dir or "."
        for callback in config.trainer.get("callbacks") or []:
            init_args = getattr(callback, "init_args", None)
            if is_checkpoint_callback(callback):
                if init_args is not None and init_args.get("dirpath") is None:
                    init_args.dirpath = os.path.join(root, "checkpoints")
        if config.trainer.get("logger") is None:  # not a parser default: parsing imports wandb
            config.trainer.logger = default_logger()
        init_args = _wandb_init_args(config)
        if init_args is not None and init_args.get("save_dir") in (None, "."):
            init_args.save_dir = root

    @staticmethod
    def _make_logger_dir(config: Any) -> None:
        # Only once the command is known to run: a refused fit leaves no directory behind.
        init_args = _wandb_init_args(config)
        if init_args is not None:
            os.makedirs(init_args.save_dir, exist_ok=True)


def _wandb_init_args(config: Any) -> Any:
    """The ``init_args`` of the command's W&B logger, or ``None`` (another or no logger)."""
    logger = config.trainer.get("logger")
    init_args = getattr(logger, "init_args", None)
    if init_args is None or not str(logger.class_path).endswith("WandbLogger"):
        return None
    return init_args


def default_logger() -> Namespace:
    """The logger of a run that names none: W&B, offline unless an API key is configured.

    Applied to the parsed config rather than given as a trainer default: a default is
    parsed on every command, and resolving ``WandbLogger``'s signature imports ``wandb``,
    which makes two temporary directories in ``$TMPDIR`` even with ``--trainer.logger
    false`` (left there by a process that is killed).
    """
    init_args = Namespace(project="ssl-rec", offline=wandb_offline())
    return Namespace(class_path="pytorch_lightning.loggers.WandbLogger", init_args=init_args)


def trainer_defaults() -> dict[str, Any]:
    """Trainer defaults: durable checkpoint writes (the W&B logger is :func:`default_logger`).

    ``DurableCheckpointIO`` writes each checkpoint to its directory atomically with per-tensor
    checksums (:mod:`ssl_rec.lightning.durable_checkpoint_io`); a ``--trainer.plugins`` given
    by the user replaces it.
    """
    return {
        "plugins": [{"class_path": "ssl_rec.lightning.durable_checkpoint_io.DurableCheckpointIO"}],
    }
