"""No import circles in ``ssl_rec``, at module level or hidden inside functions.

Every module is parsed with ``ast`` (nothing is imported) and every ``import`` / ``from ...
import`` of an ``ssl_rec`` module anywhere in the file is an edge: at module level, inside
functions and methods, under ``if TYPE_CHECKING:`` and in ``try`` blocks alike (a lazy import
postpones a circle to run time, it does not remove it). The rules:

- Nodes are modules; a package's ``__init__.py`` is the node named by the package.
- ``import a.b.c`` and ``from a.b.c import name`` are edges to ``a.b.c``, and ``from a.b
  import c`` is an edge to the submodule ``a.b.c`` when there is one, else to ``a.b`` (its
  ``__init__``, which defines or re-exports ``c``). Relative imports are resolved first.
- Importing ``a.b.c`` first runs the ``__init__`` of ``a`` and ``a.b``: these are edges too,
  except for the importer's own enclosing packages, which are already being imported when
  the importer runs. So a package ``__init__`` re-exporting its own submodules is not a
  circle, while a submodule reading a name from its own package's ``__init__`` (``from
  ssl_rec.quantize import Rows`` inside ``ssl_rec/quantize/``) is an edge to that
  ``__init__``, and a circle when the ``__init__`` imports it.
- Imports by computed name (``importlib.import_module(name)``, the command table of
  :mod:`ssl_rec.cli.commands`) are not edges: they name modules as data.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def modules_of(source_root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, whether it is a package ``__init__``) for every ``.py`` file."""
    modules = {}
    for path in sorted((source_root / package).rglob("*.py")):
        parts = list(path.relative_to(source_root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _imports(tree: ast.AST, name: str, is_package: bool) -> Iterator[tuple[str, str | None]]:
    """``(module, imported name or None)`` of every import statement in ``tree``."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                yield base, alias.name


def import_graph(source_root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (the rules of the module docstring)."""
    modules = modules_of(source_root, package)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        own = set(_ancestors(name)) | ({name} if is_package else set())
        edges: set[str] = set()
        for module, imported in _imports(ast.parse(path.read_text()), name, is_package):
            if module != package and not module.startswith(package + "."):
                continue
            submodule = f"{module}.{imported}"
            target = submodule if imported is not None and submodule in modules else module
            while target not in modules:  # `import pkg.missing`: the part that exists
                target = target.rpartition(".")[0]
            edges.add(target)  # own package's __init__ too: a name is read from it
            edges.update(a for a in _ancestors(target) if a not in own)
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` as ``[a, b, ..., a]``, or ``None`` when it is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def test_ssl_rec_has_no_import_circles() -> None:
    graph = import_graph(ROOT, "ssl_rec")
    assert len(graph) > 100 and "ssl_rec.cli.main" in graph["ssl_rec.cli"]
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (  # a function-level import back, as cli/main <-> cli/shard_plan_command was
            {"pkg/__init__.py": "", "pkg/a.py": "from pkg.b import f\n",
             "pkg/b.py": "def f():\n    from pkg.a import g\n"},
            ["pkg.a", "pkg.b", "pkg.a"],
        ),
        (  # relative imports, `from . import module`
            {"pkg/__init__.py": "", "pkg/sub/__init__.py": "", "pkg/sub/a.py": "from . import b\n",
             "pkg/sub/b.py": "from ..sub.a import x\n"},
            ["pkg.sub.a", "pkg.sub.b", "pkg.sub.a"],
        ),
        (  # a name read from the own package's __init__, which imports the module
            {"pkg/__init__.py": "from pkg.a import A\n", "pkg/a.py": "from pkg import B\n"},
            ["pkg", "pkg.a", "pkg"],
        ),
        (  # importing a submodule runs its package's __init__ first
            {"pkg/__init__.py": "", "pkg/a.py": "import pkg.sub.b\n",
             "pkg/sub/__init__.py": "from pkg.a import x\n", "pkg/sub/b.py": ""},
            ["pkg.a", "pkg.sub", "pkg.a"],
        ),
        (  # TYPE_CHECKING imports count
            {"pkg/__init__.py": "", "pkg/a.py": "import pkg.b\n",
             "pkg/b.py": "if TYPE_CHECKING:\n    from pkg.a import A\n"},
            ["pkg.a", "pkg.b", "pkg.a"],
        ),
    ],
)  # fmt: skip
def test_the_checker_finds_circles(tmp_path: Path, files: dict[str, str], expected) -> None:
    _write(tmp_path, files)
    assert find_cycle(import_graph(tmp_path, "pkg")) == expected


def test_the_checker_allows_re_exports_and_other_packages(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "from pkg.a import A\nfrom pkg.sub import B\n",
        "pkg/a.py": "import os\nfrom other import pkg\nfrom pkg.sub.b import B\n",
        "pkg/sub/__init__.py": "from .b import B\n",
        "pkg/sub/b.py": "from pkg import c\n",
        "pkg/c.py": "",
    })  # fmt: skip
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg"] == {"pkg.a", "pkg.sub"}
    assert graph["pkg.a"] == {"pkg.sub.b", "pkg.sub"}
    assert graph["pkg.sub"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.c"}  # the submodule, not the own package's __init__
    assert find_cycle(graph) is None


# Distribution name -> import name where they differ; build tools run, never imported.
IMPORT_NAMES = {"pytorch-lightning": "pytorch_lightning", "faiss-cpu": "faiss"}
BUILD_TOOLS = {"ninja"}  # run by torch.utils.cpp_extension when the kernels compile


def test_every_declared_dependency_is_imported() -> None:
    tomllib = pytest.importorskip("tomllib")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[\[<>=!~ ;]", spec, maxsplit=1)[0].lower() for spec in declared}
    imported = set()
    for path, is_package in modules_of(ROOT, "ssl_rec").values():
        tree = ast.parse(path.read_text())
        imported |= {m.split(".")[0] for m, _ in _imports(tree, "ssl_rec.x", is_package)}
    unused = sorted(n for n in names - BUILD_TOOLS if IMPORT_NAMES.get(n, n.replace("-", "_"))
                    not in imported)  # fmt: skip
    assert unused == [], f"declared in pyproject.toml, never imported by ssl_rec: {unused}"
