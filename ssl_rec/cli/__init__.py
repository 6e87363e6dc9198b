"""The ``ssl-rec`` command line: LightningCLI subcommands, export/evaluation and the demo."""

from ssl_rec.cli.commands import instantiate
from ssl_rec.cli.lightning_cli import SSLRecCLI
from ssl_rec.cli.main import main, run

__all__ = ["SSLRecCLI", "instantiate", "main", "run"]
