"""A/B of the embedding kernels of two source trees in one process: a git revision's
`ssl_rec/hardware/kernels/csrc` against the working tree's, each built as its own extension,
timed on the same batches in interleaved rounds (admit, gather and update called directly,
no autograd), with each kernel phase's CPU time per step.

    python benchmarks/kernel_ab.py --base HEAD [--quick] [--batch 4096]
        [--kinds int8_cache5,fp32] [--skew criteo] [--rounds 9] [--eval] --json OUT.json

Prints, per table kind, each phase's median ms per step for A (the revision) -> B (the
working tree) and the median of per-round step-time ratios A / B (> 1: B faster). Two builds
take about two minutes the first time (cached by source hash under TORCH_EXTENSIONS_DIR).
``--quick``: tables capped at 50k rows, 3 rounds. ``--eval``: the eval-mode lookup
(``forward``: cached row, else the dequantized store row, nothing written) instead of the
training step, on tables trained for two cycles first (their caches filled alike on both
sides). Writes the JSON and a PNG beside it.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

if not __package__:  # `python benchmarks/kernel_ab.py`: import the package from the root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks._embedding_cases import reexec_with_memory_env
from benchmarks._harness import Figure, Recording, benchmark_parser, pyplot

REPO = Path(__file__).resolve().parents[1]
CSRC = "ssl_rec/hardware/kernels/csrc"
KINDS = {"int8_cache5": ("int8", 0.05), "int4_cache1": ("int4", 0.01), "fp32": ("fp32", 0.0)}


def source_tree(rev: str | None, into: Path) -> Path:
    """The kernel sources of git revision ``rev`` (None: the working tree) copied into ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    for path in sorted((REPO / CSRC).iterdir()):
        if rev is None:
            data = path.read_bytes()
        else:
            spec = f"{rev}:{CSRC}/{path.name}"
            done = subprocess.run(["git", "-C", str(REPO), "show", spec], capture_output=True)
            if done.returncode != 0:
                continue  # a file the revision does not have
            data = done.stdout
        (into / path.name).write_bytes(data)
    return into


def build(tree: Path, label: str) -> ModuleType:
    """The extension built from ``tree``, named by its sources' hash (rebuilt only on change)."""
    from ssl_rec.hardware.kernels.dispatch import build_extension

    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(tree.iterdir()))).hexdigest()
    return build_extension(tree, f"ssl_rec_ab_{label}_{digest[:12]}")


def run(args: argparse.Namespace) -> dict:
    """Build both trees, time every kind under both, return the medians and ratios."""
    import torch

    from benchmarks._embedding_cases import DIM, make_batch
    from ssl_rec.data import CRITEO_KAGGLE_CARDINALITIES
    from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec
    from ssl_rec.hardware.kernels.compiled import CompiledKernels

    with tempfile.TemporaryDirectory() as tmp:
        exts = {
            "A": build(source_tree(args.base, Path(tmp) / "a"), "a"),
            "B": build(source_tree(None, Path(tmp) / "b"), "b"),
        }
    torch.set_num_threads(args.threads)
    cards = [c if args.cap == 0 else min(c, args.cap) for c in CRITEO_KAGGLE_CARDINALITIES]
    batches = [make_batch(cards, args.batch, seed, args.skew) for seed in range(8)]
    groups = {}
    for side in exts:
        for kind in args.kinds:
            precision, cache = KINDS[kind]
            spec = TableSpec(precision, cache, optimizer=args.optimizer)
            groups[side, kind] = MixedPrecisionEmbeddingCollection(cards, DIM, spec, seed=0).group

    def cycle(side: str, kind: str, step: int, evaluate: bool) -> float:
        t, ext = groups[side, kind].tensors(), exts[side]
        if hasattr(ext, "TableSet"):
            k = CompiledKernels(ext)
            t = k.bind(t)  # as a table group does: validated once
        else:
            k = ListKernels(ext)
        start = time.thread_time()
        for i, b in enumerate(batches):
            if evaluate:
                k.forward(t, b["ids"])
                continue
            plan = k.admit(t, b["ids"], 0, 2 * (step + i))
            k.gather(t, plan)
            k.update(t, plan, b["grad"], 0, 2 * (step + i) + 1)
        return (time.thread_time() - start) / len(batches)

    for side in exts:  # warm-up (and, for --eval, the training that fills the caches)
        for kind in args.kinds:
            for step in range(2 if args.eval else 1):
                cycle(side, kind, 8 * step, evaluate=False)
    times: dict[tuple[str, str, str], list[float]] = {}
    for r in range(args.rounds):
        for side in "AB" if r % 2 else "BA":
            ext = exts[side]
            for kind in args.kinds:
                ext.phase_seconds(on=True, reset=True)
                seconds = cycle(side, kind, 8 * (r + 1), args.eval)
                times.setdefault((side, kind, "step"), []).append(seconds)
                for phase, sec in ext.phase_seconds(on=False, reset=True).items():
                    if sec:
                        times.setdefault((side, kind, phase), []).append(sec / len(batches))
    measured = "eval lookup" if args.eval else "training step"
    out: dict = {"base": args.base, "batch": args.batch, "skew": args.skew,
                 "measured": measured, "kinds": {}}  # fmt: skip
    for kind in args.kinds:
        phases = sorted({p for (_, k, p) in times if k == kind}, key=lambda p: p != "step")
        ms = {
            p: {
                s: statistics.median(times[s, kind, p]) * 1e3 for s in "AB" if (s, kind, p) in times
            }
            for p in phases
        }
        ratio = statistics.median(
            a / b for a, b in zip(times["A", kind, "step"], times["B", kind, "step"], strict=True)
        )
        out["kinds"][kind] = {"ms_per_step": ms, "step_ratio_a_over_b": ratio}
        line = "  ".join(f"{p} {v.get('A', 0):.2f}->{v.get('B', 0):.2f}" for p, v in ms.items())
        print(f"B={args.batch} {args.skew} {kind}: {line}")
        print(f"   step time A / B, median over rounds: {ratio:.3f} (> 1: working tree faster)")
    return out


def plot(result: dict) -> Figure:
    """Per-phase ms per step, A vs B, one panel per kind."""
    plt = pyplot()
    kinds = list(result["kinds"])
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 3.5), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        ms = result["kinds"][kind]["ms_per_step"]
        names = list(ms)
        for j, side in enumerate("AB"):
            label = result["base"] if side == "A" else "working tree"
            widths = [ms[p].get(side, 0) for p in names]
            ax.barh([i + 0.4 * j for i in range(len(names))], widths, height=0.4, label=label)
        ax.set_yticks([i + 0.2 for i in range(len(names))], names)
        ax.set_xlabel("ms per step")
        ax.set_title(f"{kind}, B = {result['batch']}")
        ax.legend()
    fig.tight_layout()
    return fig


def parse_args() -> argparse.Namespace:
    """Command-line options; a bad value exits with status 2 and one line."""
    parser = benchmark_parser(__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="git revision of variant A")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--kinds", default="int8_cache5,fp32")
    parser.add_argument("--skew", choices=("criteo", "uniform"), default="criteo")
    parser.add_argument(
        "--optimizer", choices=("sgd", "rowwise_adagrad"), default="rowwise_adagrad"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--eval", action="store_true", help="time the eval-mode lookup")
    parser.add_argument("--rounds", type=int, help="default 9 (3 with --quick)")
    parser.add_argument(
        "--cap",
        type=int,
        help="rows per table at most (0: Criteo-Kaggle's; default 250000, 50000 with --quick)",
    )
    args = parser.parse_args()
    args.rounds = (3 if args.quick else 9) if args.rounds is None else args.rounds
    args.cap = (50_000 if args.quick else 250_000) if args.cap is None else args.cap
    args.kinds = args.kinds.split(",")
    bad = [k for k in args.kinds if k not in KINDS]
    if bad:
        parser.error(f"--kinds: unknown {bad}; choose from {list(KINDS)}")
    if args.batch < 1 or args.rounds < 1 or args.threads < 1:
        parser.error("--batch, --rounds and --threads must be at least 1")
    if args.cap < 0:
        parser.error(f"--cap {args.cap}: give a row count, or 0 for no cap")
    found = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "-q", args.base],
                           capture_output=True)  # fmt: skip
    if found.returncode != 0:
        parser.error(f"--base: {args.base!r} is not a git revision of {REPO}")
    return args


class ListKernels:
    """The training kernels of a revision before ``TableSet``: tables as lists on every call."""

    def __init__(self, ext: ModuleType) -> None:
        self._ext = ext

    def admit(self, t, ids, seed, step):  # noqa: ANN001, ANN201, D102
        from ssl_rec.hardware.kernels.table_meta import AdmittedBatch

        return AdmittedBatch(*self._ext.admit(*t, ids, seed, step, [], True))

    def gather(self, t, plan):  # noqa: ANN001, ANN201, D102
        return self._ext.gather(*t, tuple(plan))

    def forward(self, t, ids):  # noqa: ANN001, ANN201, D102
        return self._ext.lookup(*t, ids)

    def update(self, t, plan, grad, seed, step) -> None:  # noqa: ANN001, D102
        self._ext.update(*t, tuple(plan), grad, seed, step)


def main() -> None:
    """Run the A/B and write its JSON and plot."""
    args = parse_args()
    reexec_with_memory_env(all_huge_pages=False)
    record = Recording(__file__)
    record.write(args.json, run(args), plot, threads=args.threads)


if __name__ == "__main__":
    sys.exit(main())
