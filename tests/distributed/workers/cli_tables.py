"""``ssl-rec`` recording every embedding table this process builds (declared or allocated).

    TABLES_LOG=DIR python cli_tables.py fit --config CFG --trainer.devices 2 ...

Runs the command line unchanged; Lightning's launcher re-runs this script for the other
ranks, so each process writes ``DIR/<pid>.json`` at exit: its rank and one entry per
``EmbeddingTable`` built (name, rows, declared or allocated, bytes of its store).
"""

from __future__ import annotations

import atexit
import json
import os
from pathlib import Path

from ssl_rec.hardware import table as table_module

BUILT: list[dict] = []
_init = table_module.EmbeddingTable.__init__


def _recording_init(self, num_rows: int, dim: int, spec, stream: int, *args, **kwargs) -> None:
    _init(self, num_rows, dim, spec, stream, *args, **kwargs)
    BUILT.append({"name": self.name, "rows": int(num_rows), "declared": bool(self.declared),
                  "store_bytes": self.store.numel() * self.store.element_size()})  # fmt: skip


def _write() -> None:
    rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
    out = Path(os.environ["TABLES_LOG"]) / f"{os.getpid()}.json"
    out.write_text(json.dumps({"rank": rank, "tables": BUILT}))


table_module.EmbeddingTable.__init__ = _recording_init
atexit.register(_write)

if __name__ == "__main__":
    from ssl_rec.cli.main import main

    main()
