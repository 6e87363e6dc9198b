"""The one convention of every benchmark: its command line, its JSON envelope and its outputs.

Every ``benchmarks/<name>.py`` takes ``--quick`` (a smoke run), ``--json PATH`` (required; the
PNG goes beside it) and, where it has seeds, ``--seeds`` (:func:`benchmark_parser`). It opens a
:class:`Recording` once its arguments are read and ends with :meth:`Recording.write`, which
writes the envelope atomically and then the figure, atomically too::

    {"benchmark": "data", "argv": ["benchmarks/data.py", "--json", "out.json"],
     "commit": "<sha of HEAD>", "dirty": false,
     "versions": {"python": "3.11.9", "torch": "2.13.0", "ssl_rec": "0.1.0", ...},
     "threads": 2, "load_average": {"start": [1.5, 0.6, 0.2], "end": [1.8, 1.1, 0.5]},
     "results": {...the benchmark's own figures...}}

``commit`` is the code the run started from (``dirty``: tracked files differed from it),
``threads`` the intra-op thread count of the measured work (``null`` where it varies between
parts; they record their own), ``load_average`` the 1/5/15-minute load averages when the run
started and ended. A value not known (results recorded before the envelope) is ``null``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from numbers import Real
from pathlib import Path
from typing import Any, Literal

from ssl_rec._io import atomic_write_bytes, atomic_write_json

ROOT = Path(__file__).resolve().parents[1]
ENVELOPE_KEYS = (
    "benchmark",
    "argv",
    "commit",
    "dirty",
    "versions",
    "threads",
    "load_average",
    "results",
)
# versions key -> distribution name; the first three are always recorded (None: not installed)
PACKAGES = {
    "torch": "torch",
    "ssl_rec": "ssl-rec",
    "numpy": "numpy",
    "pytorch_lightning": "pytorch-lightning",
    "faiss": "faiss-cpu",
    "fbgemm_gpu": "fbgemm-gpu-cpu",
    "torchrec": "torchrec",
}
REQUIRED_VERSIONS = ("python", "torch", "ssl_rec")
Figure = Any  # a matplotlib Figure: matplotlib is imported only when a plot is drawn


def benchmark_parser(
    description: str | None, seeds: bool = False, json_required: bool = True
) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark shares.

    Args:
        description: the ``--help`` text (the script's docstring or its first line).
        seeds: add ``--seeds`` (see :func:`chosen_seeds`).
        json_required: ``--json`` must be given; ``False``: it may be omitted (``None``: the
            script names its default file under ``benchmarks/results/``).

    Returns:
        A parser with ``--quick``, ``--json`` (a required ``Path``) and maybe ``--seeds``; the
        script adds its own options.

    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes, few rounds")
    parser.add_argument(
        "--json",
        type=Path,
        required=json_required,
        help="output JSON path (the PNG is written beside it)",
    )
    if seeds:
        parser.add_argument(
            "--seeds", type=int, nargs="+", help="default: the study's seeds (--quick: its first)"
        )
    return parser


def chosen_seeds(args: argparse.Namespace, default: Sequence[int]) -> tuple[int, ...]:
    """``--seeds`` as given, else ``default`` (its first seed only with ``--quick``)."""
    if args.seeds:
        return tuple(args.seeds)
    return tuple(default[:1] if args.quick else default)


def git_commit() -> tuple[str | None, bool | None]:
    """``HEAD`` of the repository and whether tracked files differ from it (None: no git)."""

    def git(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["git", "-C", str(ROOT), *argv], capture_output=True, text=True, check=False
        )

    try:
        head = git("rev-parse", "HEAD")
        status = git("status", "--porcelain", "--untracked-files=no")
    except OSError:  # no git on this machine
        return None, None
    if head.returncode != 0:
        return None, None
    return head.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None


def versions() -> dict[str, str | None]:
    """Python's version and those of the installed packages in :data:`PACKAGES` (None: absent)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for key, distribution in PACKAGES.items():
        try:
            out[key] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            out[key] = None
    return out


def portable_path(arg: str) -> str:
    """``arg`` as a recording may keep it: no path of the machine that ran the benchmark.

    An absolute path inside the repository becomes relative to its root, one elsewhere (a
    scratch directory) its file name; anything else is returned as it is.
    """
    path = Path(arg)
    if not path.is_absolute():
        return arg
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return path.name


def torch_threads() -> int | None:
    """Torch's intra-op thread count now, or None if torch was not imported."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


class Recording:
    """One run of a benchmark: what ran, on which code, under which load; writes its outputs.

    Open it once the arguments are parsed (the start's load average and commit are taken
    then), call :meth:`write` at the end.

    Args:
        script: the benchmark's ``__file__`` (its stem names the benchmark).
        argv: its arguments (default: ``sys.argv[1:]``); recorded through
            :func:`portable_path`.

    """

    def __init__(self, script: str, argv: Sequence[str] | None = None) -> None:
        self.name = Path(script).stem
        given = sys.argv[1:] if argv is None else argv
        self.argv = [f"benchmarks/{self.name}.py", *map(portable_path, given)]
        self.commit, self.dirty = git_commit()
        self.versions = versions()
        self.load_start = list(os.getloadavg())

    def envelope(self, results: dict, threads: int | None | Literal["torch"] = "torch") -> dict:
        """The JSON document of ``results``; ``threads="torch"``: :func:`torch_threads` now."""
        return {
            "benchmark": self.name,
            "argv": self.argv,
            "commit": self.commit,
            "dirty": self.dirty,
            "versions": self.versions,
            "threads": torch_threads() if threads == "torch" else threads,
            "load_average": {"start": self.load_start, "end": list(os.getloadavg())},
            "results": results,
        }

    def write(
        self,
        path: str | os.PathLike[str],
        results: dict,
        plot: Callable[[dict], Figure] | None = None,
        dpi: int = 100,
        threads: int | None | Literal["torch"] = "torch",
    ) -> dict:
        """Write the envelope of ``results`` to ``path``, then ``plot(results)`` beside it.

        Args:
            path: the JSON file; the PNG is ``path`` with the suffix ``.png``.
            results: the benchmark's figures (JSON-serializable).
            plot: builds the matplotlib figure from ``results``; None: no PNG.
            dpi: the PNG's resolution.
            threads: see :meth:`envelope`.

        Returns:
            The envelope written. The JSON is written before the figure is drawn, so a failing
            plot loses no measurement.

        """
        document = self.envelope(results, threads)
        atomic_write_json(path, document)
        if plot is not None:
            save_figure(plot(results), Path(path).with_suffix(".png"), dpi)
        return document


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (benchmarks draw to files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def ratio_bars(labels: list[str], values: list[float], xlabel: str, width: float,
               row_height: float) -> Figure:  # fmt: skip
    """Horizontal bars, one row per label, with a black line at ratio 1 (parity).

    Args:
        labels: the bars' names, top to bottom.
        values: the ratios (unitless), one per label.
        xlabel: the x axis' label (what a ratio above 1 means).
        width: the figure's width in inches.
        row_height: inches per bar; the figure is ``row_height * len(labels) + 1.5`` high.

    """
    fig, ax = pyplot().subplots(figsize=(width, row_height * len(labels) + 1.5))
    ax.barh(labels, values)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel(xlabel)
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    return fig


def save_figure(fig: Figure, path: str | os.PathLike[str], dpi: int = 100) -> None:
    """Render ``fig`` as PNG into memory, write it to ``path`` atomically and close it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    pyplot().close(fig)
    atomic_write_bytes(path, buf.getvalue())


def envelope_problems(document: Any) -> list[str]:
    """What keeps ``document`` from being a benchmark envelope (empty: it is one)."""
    if not isinstance(document, dict):
        return [f"not a JSON object but {type(document).__name__}"]
    problems = []
    if set(document) != set(ENVELOPE_KEYS):
        problems.append(f"keys {sorted(document)}, expected {sorted(ENVELOPE_KEYS)}")
    checks = {
        "benchmark": lambda v: isinstance(v, str) and v != "",
        "argv": lambda v: v is None or (isinstance(v, list) and all(isinstance(a, str) for a in v)),
        "commit": lambda v: v is None or (isinstance(v, str) and _is_sha(v)),
        "dirty": lambda v: v is None or isinstance(v, bool),
        "versions": _is_versions,
        "threads": lambda v: v is None or (type(v) is int and v > 0),
        "load_average": _is_load_average,
        "results": lambda v: isinstance(v, dict) and len(v) > 0,
    }
    for key, ok in checks.items():
        if key in document and not ok(document[key]):
            problems.append(f"{key}: {document[key]!r:.120}")
    return problems


def _is_sha(text: str) -> bool:
    return 7 <= len(text) <= 40 and all(c in "0123456789abcdef" for c in text)


def _is_versions(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and all(k in value for k in REQUIRED_VERSIONS)
        and all(v is None or isinstance(v, str) for v in value.values())
    )


def _is_load(x: Any) -> bool:
    return x is None or (isinstance(x, Real) and not isinstance(x, bool) and x >= 0)


def _is_load_average(value: Any) -> bool:
    """``{"start": triple, "end": triple}``, a triple None or 3 loads (each a number or None)."""
    if not isinstance(value, dict) or set(value) != {"start", "end"}:
        return False
    return all(
        v is None or (isinstance(v, list) and len(v) == 3 and all(_is_load(x) for x in v))
        for v in value.values()
    )
