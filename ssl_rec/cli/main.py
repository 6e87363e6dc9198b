"""The ``ssl-rec`` command: dispatches to the subcommands of :mod:`ssl_rec.cli.commands`.

Examples:
    ssl-rec fit --config configs/ctr/synthetic.yaml
    ssl-rec test --config configs/ctr/synthetic.yaml --ckpt_path best
    ssl-rec export --ckpt_path CKPT --out DIR --fields '[C1,C2]' --index 'IVF256,PQ16'
    ssl-rec plan --config configs/dist/synthetic_int8_row_wise.yaml --world_size 8
    ssl-rec quantize --ckpt_path CKPT --out DIR --budget_ne 0.001

"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from ssl_rec.class_paths import allowed_classes
from ssl_rec.cli.allow_class_option import ALLOW_HELP, split_allow_option
from ssl_rec.cli.commands import SUBCOMMANDS, lightning_cli
from ssl_rec.cli.environment import configure_environment
from ssl_rec.cli.errors import guarded
from ssl_rec.cli.flag_vocabulary import canonical_flags
from ssl_rec.cli.run_dir import RunConfig
from ssl_rec.distributed.launcher import follow_launcher

HELP = """usage: ssl-rec SUBCOMMAND [options]     (ssl-rec SUBCOMMAND --help for its options)

Self-supervised representation learning for recommender systems.

subcommands:
{rows}

examples:
  ssl-rec fit --config configs/ctr/synthetic.yaml
  ssl-rec test --config configs/ctr/synthetic.yaml \\
      --ckpt_path runs/ctr/synthetic/checkpoints/best.ckpt
  ssl-rec export --ckpt_path CKPT --out runs/export --fields '[C1,C2]'
  ssl-rec quantize --ckpt_path CKPT --out runs/quantized --budget_ne 0.001

Flags are spelled with underscores; a checkpoint is always --ckpt_path.

--debug (or SSL_REC_DEBUG=1) shows the Python traceback of an error.
{allow}"""


def print_help() -> None:
    """The overview of every subcommand (LightningCLI's own help lists only its four)."""
    rows = "\n".join(f"  {name:<22}{command.summary}" for name, command in SUBCOMMANDS.items())
    print(HELP.format(rows=rows, allow=textwrap.fill(ALLOW_HELP, 92)))


def run(args: Sequence[str] | None = None) -> Any:
    """Run one ``ssl-rec`` command and return what it built (the CLI object for fit/test).

    Args:
        args: the command line without the program name; ``None`` reads ``sys.argv``.
    """
    configure_environment()
    argv, allowed = split_allow_option(sys.argv[1:] if args is None else args)
    with allowed_classes(allowed):  # classes a checkpoint or model directory may name
        return _dispatch(argv)


def _dispatch(argv: list[str]) -> Any:
    """Run the subcommand ``argv[0]``."""
    if not argv or argv[0] in ("-h", "--help"):
        print_help()
        return None
    command = SUBCOMMANDS.get(argv[0])
    if command is None:  # LightningCLI names the subcommands it knows
        return lightning_cli(argv, save_config_callback=RunConfig)
    argv = [argv[0], *canonical_flags(argv[1:], command.renamed_flags)]
    if command.entry is not None:
        return command.load()(argv[1:])
    if argv[0] == "predict" and _predicts_quantized(argv[1:]):
        from ssl_rec.cli.predict_quantized import predict_main  # lazy, as a command's entry

        return predict_main(argv[1:])
    if argv[0] == "predict":
        argv = _predictions_out_alias(argv)
    return lightning_cli(argv, save_config_callback=RunConfig)


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


def main(args: Sequence[str] | None = None) -> None:
    """Entry point of the ``ssl-rec`` console script.

    A user's mistake (bad data, config value, path) prints one line and exits with status 2;
    ``--debug`` shows the traceback. Returns nothing, so success exits with status 0.
    A torchrun worker ends when its launcher dies (:func:`follow_launcher`).
    """
    follow_launcher()
    try:
        guarded(run, list(sys.argv[1:] if args is None else args))
    except BrokenPipeError:  # output piped into a program that stopped reading (`| head`)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - replaces the closed stream


if __name__ == "__main__":
    main()
