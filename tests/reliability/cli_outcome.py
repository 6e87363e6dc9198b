"""What the reliability tests assert of a command's end: one error line, exit status 2.

Also the tiny synthetic CTR fit their module fixtures train (500/100/100 rows, quiet).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ssl_rec.cli import main

ERROR = "ssl-rec: error:"
SYNTHETIC_SIZES = {"n_train": 500, "n_val": 100, "n_test": 100}
QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false"]  # fmt: skip


def synthetic_fit(cache: Path, root: Path, *extra: str) -> list[str]:
    """``ssl-rec fit`` argv of ``configs/ctr/synthetic.yaml`` with SYNTHETIC_SIZES, quiet.

    Args:
        cache: the data module's cache root.
        root: the trainer's ``default_root_dir`` (the run directory).
        extra: more command-line arguments, appended.

    """
    sizes = [f"--data.init_args.{k}={v}" for k, v in SYNTHETIC_SIZES.items()]
    return ["fit", "--config", "configs/ctr/synthetic.yaml", *sizes,
            f"--data.init_args.cache_dir={cache}", f"--trainer.default_root_dir={root}",
            *QUIET, *extra]  # fmt: skip


def error_line(err: str) -> str:
    """The one ``ssl-rec: error:`` line of ``err``, asserted to be the last line, no traceback."""
    lines = [line for line in err.splitlines() if ERROR in line]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert ERROR in err.strip().splitlines()[-1], err
    return lines[0]


def exit_code(argv: list[str]) -> int:
    """The exit status ``main(argv)`` ends with (it must end with ``SystemExit``)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], *parts: str) -> str:
    """Run ``argv``; assert exit status 2 and one error line holding every one of ``parts``.

    Returns:
        The message, the text after ``ssl-rec: error:``.

    """
    assert exit_code(argv) == 2
    message = error_line(capsys.readouterr().err).split(ERROR)[1]
    for part in parts:
        assert part in message, (part, message)
    return message
