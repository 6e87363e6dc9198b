"""The ``ssl-rec`` command: LightningCLI (fit/validate/test/predict) plus export/evaluation.

Examples:
    ssl-rec fit --config configs/ctr/synthetic.yaml
    ssl-rec test --config configs/ctr/synthetic.yaml --ckpt_path best
    ssl-rec export --ckpt CKPT --out DIR --fields '[C1,C2]' --index 'IVF256,PQ16'

"""

from __future__ import annotations

import sys
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


# Subcommands beside LightningCLI's fit/validate/test/predict: name -> entry taking argv.
EXTRA_COMMANDS: dict[str, Callable[[Sequence[str]], Any]] = {
    "export": _export,
    "evaluate-embeddings": _evaluate,
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


def main(args: Sequence[str] | None = None) -> None:
    """Entry point of the ``ssl-rec`` console script (returns nothing, so exit status is 0)."""
    run(args)


if __name__ == "__main__":
    main()
