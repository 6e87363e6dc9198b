"""The table of ``ssl-rec`` subcommands, and :func:`instantiate`, the LightningCLI they share.

:data:`SUBCOMMANDS` names every subcommand once: LightningCLI's ``fit``, ``validate``,
``test`` and ``predict``, and the others as ``"module:function"`` entries taking the command
line after the name, imported only when they run (FAISS, torchao and TorchRec load when
needed). Commands import this module for :func:`instantiate`; it imports none of them, and
:mod:`ssl_rec.cli.main` only dispatches, so no import runs in a circle.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytorch_lightning as pl

from ssl_rec.cli.environment import configure_environment
from ssl_rec.cli.lightning_cli import SSLRecCLI, trainer_defaults

__all__ = ["SUBCOMMANDS", "Subcommand", "instantiate", "lightning_cli"]


@dataclass(frozen=True)
class Subcommand:
    """One ``ssl-rec`` subcommand.

    Attributes:
        summary: its line in ``ssl-rec --help``.
        entry: ``"module:function"`` of its entry point, called with the command line after
            the subcommand's name; ``None`` for LightningCLI's own subcommands.
        renamed_flags: old spelling -> flag, still accepted with a notice
            (:mod:`ssl_rec.cli.flag_vocabulary`).

    """

    summary: str
    entry: str | None = None
    renamed_flags: Mapping[str, str] = field(default_factory=dict)

    def load(self) -> Callable[[Sequence[str]], Any]:
        """Import and return the entry point (``ValueError`` for LightningCLI's own)."""
        if self.entry is None:
            raise ValueError("a LightningCLI subcommand has no entry of its own")
        module, _, name = self.entry.partition(":")
        return getattr(importlib.import_module(module), name)


_CKPT = {"--ckpt": "--ckpt_path"}  # export, evaluate-embeddings and quantize said --ckpt
_REFERENCE = {"--reference": "--ckpt_path"}  # explain and monitor said --reference
SUBCOMMANDS: dict[str, Subcommand] = {
    "fit": Subcommand("train a model from a config (pretraining or CTR)"),
    "validate": Subcommand("validation metrics of a checkpoint"),
    "test": Subcommand("test metrics of a checkpoint (writes metrics.json)"),
    "predict": Subcommand(
        "predictions of a checkpoint or a quantized model (--ckpt_path DIR --out FILE)"
    ),
    "export": Subcommand(
        "export entity embeddings and representations with FAISS indexes",
        "ssl_rec.cli.embedding_commands:export_main",
        _CKPT,
    ),
    "evaluate-embeddings": Subcommand(
        "probe and measure a checkpoint's representations",
        "ssl_rec.cli.embedding_commands:evaluate_main",
        _CKPT,
    ),
    "plan": Subcommand(
        "plan how tables shard over N ranks (per-rank bytes, imbalance) for a config",
        "ssl_rec.cli.shard_plan_command:plan_main",
    ),
    "quantize": Subcommand(
        "quantize a CTR model for serving within an NE budget",
        "ssl_rec.cli.quantize_commands:quantize_main",
        _CKPT,
    ),
    "explain": Subcommand(
        "name the table or layer that spends a quantized model's NE budget",
        "ssl_rec.cli.quantize_commands:explain_main",
        _REFERENCE,
    ),
    "monitor": Subcommand(
        "compare a quantized model with its checkpoint on new data (exit 1 past budget)",
        "ssl_rec.cli.quantize_commands:monitor_main",
        _REFERENCE,
    ),
    "retrieve": Subcommand(
        "top-K items per input row from a two-tower export (--index DIR --data F --out F)",
        "ssl_rec.cli.retrieve_command:retrieve_main",
    ),
}


def lightning_cli(argv: Sequence[str], **kwargs: Any) -> SSLRecCLI:
    """Run (or, with ``run=False``, only build) ``SSLRecCLI`` on the command line ``argv``.

    Args:
        argv: the command line without the program name (``["fit", "--config", ...]``).
        **kwargs: more ``LightningCLI`` arguments (``save_config_callback``, ``run``).

    """
    with warnings.catch_warnings():
        # The command line is given explicitly (it may differ from sys.argv: --debug, scripts).
        warnings.filterwarnings("ignore", "LightningCLI's args parameter", UserWarning)
        return SSLRecCLI(
            pl.LightningModule,
            pl.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            trainer_defaults=trainer_defaults(),
            args=list(argv),
            **kwargs,
        )


def instantiate(args: Sequence[str]) -> SSLRecCLI:
    """Build the model, data module and trainer of a command line without running anything.

    The Python entry to the shipped configs: ``cli = instantiate(["--config", path,
    "--trainer.max_epochs=1"])`` then ``cli.trainer.fit(cli.model, cli.datamodule)``.

    Args:
        args: ``--config`` files and overrides, as after ``ssl-rec fit``.

    Returns:
        The CLI object: ``.model``, ``.datamodule``, ``.trainer``, ``.config``.

    """
    configure_environment()
    return lightning_cli(args, save_config_callback=None, run=False)
