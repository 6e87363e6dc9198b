"""``--allow_class PREFIX``: the user's own classes that checkpoints and model directories may name.

Every subcommand takes it (repeated, or comma-separated): it is taken out of the command line
before the subcommand parses it, and the command runs inside
:func:`ssl_rec.class_paths.allowed_classes`. Without it, a class path read back from a file
must name an ssl-rec class.
"""

from __future__ import annotations

from collections.abc import Sequence

ALLOW_OPTION = "--allow_class"
ALLOW_HELP = (
    f"{ALLOW_OPTION} PREFIX (any subcommand, repeatable): also build classes under PREFIX "
    "(a package such as my_pkg, or a class path) when a checkpoint or quantized model "
    "directory names them; without it only ssl-rec classes are built from a file. Use it "
    "only for files you trust."
)


def split_allow_option(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``argv`` without ``--allow_class X`` / ``--allow_class=X``, and the ``X`` s it gave.

    Each value may list several entries separated by commas.

    Raises:
        ValueError: ``--allow_class`` is last, with no value.

    """
    rest: list[str] = []
    entries: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == ALLOW_OPTION:
            value = next(args, None)
            if value is None:
                raise ValueError(f"{ALLOW_OPTION} needs a value: a package (my_pkg) or class path")
        elif arg.startswith(ALLOW_OPTION + "="):
            value = arg.split("=", 1)[1]
        else:
            rest.append(arg)
            continue
        entries.extend(e for e in value.split(",") if e.strip())
    return rest, entries
