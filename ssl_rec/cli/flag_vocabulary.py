"""One flag vocabulary for every ``ssl-rec`` subcommand: underscores, ``--ckpt_path``.

Flags are Python parameter names (``--budget_ne``, ``--world_size``, ``--json_out``), and a
checkpoint is always ``--ckpt_path``. Old spellings still work, each with a one-line notice on
stderr: dashes in a flag's name (``--budget-ne``) and a subcommand's renamed flags (``--ckpt``
and ``--reference`` are ``--ckpt_path``). Only a flag's first name is rewritten: in
``--data.init_args.KEY`` the keys after the dot are the config's own.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence

__all__ = ["canonical_flags"]

# A flag's first name (letters, digits, underscores, dashes) and the rest of the token.
_FLAG = re.compile(r"^--([A-Za-z][\w-]*)(.*)$", re.S)


def canonical_flags(argv: Sequence[str], renamed: Mapping[str, str]) -> list[str]:
    """``argv`` in the current vocabulary; a notice on stderr for each old spelling used.

    Args:
        argv: a subcommand's command line (after its name).
        renamed: old flag -> current flag for this subcommand (``{"--ckpt": "--ckpt_path"}``).

    Returns:
        The command line with ``--budget-ne`` as ``--budget_ne`` and renamed flags replaced
        (``--ckpt X`` / ``--ckpt=X`` -> ``--ckpt_path X`` / ``--ckpt_path=X``); other tokens,
        values included, unchanged.

    """
    out, noticed = [], set()
    for arg in argv:
        match = _FLAG.match(arg)
        if match is None:
            out.append(arg)
            continue
        name, rest = match[1], match[2]
        old = f"--{name}"
        new = renamed.get(old, f"--{name.replace('-', '_')}")
        if new != old and old not in noticed:
            noticed.add(old)
            print(f"ssl-rec: note: {old} is deprecated; use {new}", file=sys.stderr)
        out.append(new + rest)
    return out
