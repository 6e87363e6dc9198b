"""Names say what a thing is, once: no module basename and no public class twice in ssl_rec.

Two ``plan.py`` or two ``Plan`` classes make an import, a traceback or a search ambiguous; the
modules and classes are parsed with ``ast``, so nothing is imported.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ssl_rec"


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_package_has_modules_to_check() -> None:
    assert len(_modules()) > 50


def test_no_module_basename_appears_twice() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in _modules():
        if path.name != "__init__.py":
            where[path.name].append(str(path.relative_to(PACKAGE)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


def test_no_public_class_is_defined_twice() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert {name: places for name, places in where.items() if len(places) > 1} == {}
