"""The ``ssl-rec`` command: LightningCLI (fit/validate/test/predict) plus export/evaluation.

Examples:
    ssl-rec fit --config configs/ctr/synthetic.yaml
    ssl-rec test --config configs/ctr/synthetic.yaml --ckpt_path best
    ssl-rec export --ckpt CKPT --out DIR --fields '[C1,C2]' --index 'IVF256,PQ16'
    ssl-rec plan --config configs/dist/synthetic_int8_row_wise.yaml --world_size 8

"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pytorch_lightning as pl

from ssl_rec.cli.lightning_cli import SSLRecCLI, configure_environment, trainer_defaults


def _export(argv: Sequence[str]) -> Any:
    from ssl_rec.cli.embedding_commands import export_main  # lazy: faiss only when needed

    return export_main(argv)


def _evaluate(argv: Sequence[str]) -> Any:
    from ssl_rec.cli.embedding_commands import evaluate_main

    return evaluate_main(argv)


def _plan(argv: Sequence[str]) -> Any:
    from ssl_rec.cli.plan import plan_main  # lazy: TorchRec's planner only when planning

    return plan_main(argv)


# Subcommands beside LightningCLI's fit/validate/test/predict: name -> entry taking argv.
EXTRA_COMMANDS: dict[str, Callable[[Sequence[str]], Any]] = {
    "export": _export,
    "evaluate-embeddings": _evaluate,
    "plan": _plan,
}


def run(args: Sequence[str] | None = None) -> Any:
    """Run one ``ssl-rec`` command and return what it built (the CLI object for fit/test).

    Args:
        args: the command line without the program name; ``None`` reads ``sys.argv``.
    """
    configure_environment()
    argv = list(sys.argv[1:] if args is None else args)
    if argv and argv[0] in EXTRA_COMMANDS:
        return EXTRA_COMMANDS[argv[0]](argv[1:])
    return SSLRecCLI(
        pl.LightningModule,
        pl.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        trainer_defaults=trainer_defaults(),
        save_config_kwargs={"overwrite": True},
        args=argv if args is not None else None,
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
    with warnings.catch_warnings():
        # The caller's own sys.argv (a script's flags) is not meant for this parser.
        warnings.filterwarnings("ignore", "LightningCLI's args parameter", UserWarning)
        return SSLRecCLI(
            pl.LightningModule,
            pl.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            trainer_defaults=trainer_defaults(),
            save_config_callback=None,
            run=False,
            args=list(args),
        )


def main(args: Sequence[str] | None = None) -> None:
    """Entry point of the ``ssl-rec`` console script (returns nothing, so exit status is 0)."""
    run(args)


if __name__ == "__main__":
    main()
