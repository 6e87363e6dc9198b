"""The ``ssl-rec`` command: LightningCLI (fit/validate/test/predict) plus export/evaluation.

Examples:
    ssl-rec fit --config configs/ctr/synthetic.yaml
    ssl-rec test --config configs/ctr/synthetic.yaml --ckpt_path best
    ssl-rec export --ckpt CKPT --out DIR --fields '[C1,C2]' --index 'IVF256,PQ16'
    ssl-rec plan --config configs/dist/synthetic_int8_row_wise.yaml --world_size 8
    ssl-rec quantize --ckpt CKPT --out DIR --budget-ne 0.001

"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pytorch_lightning as pl

from ssl_rec.cli.environment import configure_environment
from ssl_rec.cli.errors import guarded
from ssl_rec.cli.lightning_cli import SSLRecCLI, trainer_defaults
from ssl_rec.cli.run_dir import RunConfig


def _export(argv: Sequence[str]) -> Any:
    from ssl_rec.cli.embedding_commands import export_main  # lazy: faiss only when needed

    return export_main(argv)


def _evaluate(argv: Sequence[str]) -> Any:
    from ssl_rec.cli.embedding_commands import evaluate_main

    return evaluate_main(argv)


def _plan(argv: Sequence[str]) -> Any:
    from ssl_rec.cli.plan import plan_main  # lazy: TorchRec's planner only when planning

    return plan_main(argv)


def _quantize(argv: Sequence[str]) -> Any:
    from ssl_rec.cli.quantize_commands import quantize_main  # lazy: torchao only when needed

    return quantize_main(argv)


def _explain(argv: Sequence[str]) -> Any:
    from ssl_rec.cli.quantize_commands import explain_main

    return explain_main(argv)


def _monitor(argv: Sequence[str]) -> Any:
    from ssl_rec.cli.quantize_commands import monitor_main

    return monitor_main(argv)


# Subcommands beside LightningCLI's fit/validate/test/predict: name -> entry taking argv.
EXTRA_COMMANDS: dict[str, Callable[[Sequence[str]], Any]] = {
    "export": _export,
    "evaluate-embeddings": _evaluate,
    "plan": _plan,
    "quantize": _quantize,
    "explain": _explain,
    "monitor": _monitor,
}
# Every subcommand with its one-line description, for `ssl-rec --help`.
SUBCOMMANDS = {
    "fit": "train a model from a config (pretraining or CTR)",
    "validate": "validation metrics of a checkpoint",
    "test": "test metrics of a checkpoint (writes metrics.json)",
    "predict": "predictions of a checkpoint or a quantized model (--ckpt_path DIR --out FILE)",
    "export": "export entity embeddings and representations with FAISS indexes",
    "evaluate-embeddings": "probe and measure a checkpoint's representations",
    "plan": "plan how tables shard over N ranks (per-rank bytes, imbalance) for a config",
    "quantize": "quantize a CTR model for serving within an NE budget",
    "explain": "name the table or layer that spends a quantized model's NE budget",
    "monitor": "compare a quantized model with its checkpoint on new data (exit 1 past budget)",
}
HELP = """usage: ssl-rec SUBCOMMAND [options]     (ssl-rec SUBCOMMAND --help for its options)

Self-supervised representation learning for recommender systems.

subcommands:
{rows}

examples:
  ssl-rec fit --config configs/ctr/synthetic.yaml
  ssl-rec test --config configs/ctr/synthetic.yaml \\
      --ckpt_path runs/ctr/synthetic/checkpoints/last.ckpt
  ssl-rec export --ckpt CKPT --out runs/export --fields '[C1,C2]'
  ssl-rec quantize --ckpt CKPT --out runs/quantized --budget-ne 0.001

--debug (or SSL_REC_DEBUG=1) shows the Python traceback of an error."""


def print_help() -> None:
    """The overview of every subcommand (LightningCLI's own help lists only its four)."""
    rows = "\n".join(f"  {name:<22}{text}" for name, text in SUBCOMMANDS.items())
    print(HELP.format(rows=rows))


def run(args: Sequence[str] | None = None) -> Any:
    """Run one ``ssl-rec`` command and return what it built (the CLI object for fit/test).

    Args:
        args: the command line without the program name; ``None`` reads ``sys.argv``.
    """
    configure_environment()
    argv = list(sys.argv[1:] if args is None else args)
    if not argv or argv[0] in ("-h", "--help"):
        print_help()
        return None
    if argv[0] in EXTRA_COMMANDS:
        return EXTRA_COMMANDS[argv[0]](argv[1:])
    if argv[0] == "predict" and _predicts_quantized(argv[1:]):
        from ssl_rec.cli.predict_quantized import predict_main

        return predict_main(argv[1:])
    if argv[0] == "predict":
        argv = _predictions_out_alias(argv)
    return _lightning_cli(argv, save_config_callback=RunConfig)


def _predictions_out_alias(argv: list[str]) -> list[str]:
    """``predict --out FILE`` (the quantized spelling) means ``--predictions.out FILE``."""
    out = []
    for arg in argv:
        if arg == "--out":
            arg = "--predictions.out"
        elif arg.startswith("--out="):
            arg = "--predictions.out=" + arg.split("=", 1)[1]
        out.append(arg)
    return out


def _predicts_quantized(argv: Sequence[str]) -> bool:
    from ssl_rec.cli.predict_quantized import quantized_checkpoint

    return quantized_checkpoint(argv) is not None


def _lightning_cli(argv: Sequence[str], **kwargs: Any) -> SSLRecCLI:
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
    return _lightning_cli(args, save_config_callback=None, run=False)


def main(args: Sequence[str] | None = None) -> None:
    """Entry point of the ``ssl-rec`` console script.

    A user's mistake (bad data, config value, path) prints one line and exits with status 2;
    ``--debug`` shows the traceback. Returns nothing, so success exits with status 0.
    """
    try:
        guarded(run, list(sys.argv[1:] if args is None else args))
    except BrokenPipeError:  # output piped into a program that stopped reading (`| head`)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - replaces the closed stream


if __name__ == "__main__":
    main()
