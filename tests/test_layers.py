"""One-way layers: importing a room loads only the rooms below it and the frameworks it may use.

Each room is imported in a fresh interpreter, so what another test imported earlier cannot
hide a dependency (the arrows of the diagram in docs/extending.md).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("pytorch_lightning", "datasets", "faiss", "wandb", "torchrec", "fbgemm_gpu", "torchao")
BOTTOM = {"types", "schema", "metrics", "vocab", "_checks", "_config", "_io", "_paths",
          "class_paths"}  # fmt: skip
# room -> (rooms it may import besides itself and the bottom layer, heavy frameworks it may load)
LAYERS: dict[str, tuple[set[str], set[str]]] = {
    **{name: (set(), set()) for name in BOTTOM},
    "hardware": (set(), set()),
    "data": (set(), {"pytorch_lightning", "datasets"}),
    "views": (set(), set()),
    "distributed": ({"hardware"}, set()),  # TorchRec only where a sharded run needs it
    "models": ({"hardware"}, set()),
    "objectives": ({"models", "views", "hardware"}, set()),
    "evaluation": ({"models", "hardware"}, {"faiss"}),
    "quantize": ({"models", "hardware", "evaluation"}, set()),
    "lightning": ({"models", "objectives", "views", "hardware", "evaluation", "distributed",
                   "quantize"},
                  {"pytorch_lightning", "faiss"}),
}  # fmt: skip


def _loaded(module: str) -> list[str]:
    code = (
        "import json, sys, importlib; importlib.import_module(sys.argv[1]); "
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, module], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("room", sorted(LAYERS))
def test_room_imports_only_what_is_below_it(room: str) -> None:
    rooms, frameworks = LAYERS[room]
    loaded = _loaded(f"ssl_rec.{room}")
    heavy = {name for name in HEAVY if name in loaded}
    assert heavy <= frameworks, f"importing ssl_rec.{room} loads {sorted(heavy - frameworks)}"
    others = {m.split(".")[1] for m in loaded if m.startswith("ssl_rec.")} - {room}
    if room in BOTTOM:
        assert others <= BOTTOM, f"ssl_rec.{room} imports rooms {sorted(others - BOTTOM)}"
    else:
        assert others <= rooms | BOTTOM, (
            f"ssl_rec.{room} imports rooms {sorted(others - rooms - BOTTOM)}"
        )


def test_no_test_module_imports_the_tests_directory_as_a_package() -> None:
    """Test helpers travel through conftest fixtures: ``tests`` is not a package, and another
    distribution's top-level ``tests`` package in site-packages would shadow it."""
    from pathlib import Path

    root = Path(__file__).resolve().parent
    offenders = [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if line.strip().startswith(("from tests", "import tests"))
    ]
    assert offenders == []
