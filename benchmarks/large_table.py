"""A table larger than RAM: INT8 store memory-mapped from disk, 1% FP32 cache in RAM.

Trains one ``rows x 64`` INT8 table (100M rows = 7.2 GB of store; 25.6 GB in FP32) with
row-wise Adagrad on Zipf-distributed ids, once with the store in RAM and once memory-mapped
(``TableSpec.store_dir``), each in a fresh process; reports samples/s, the cache hit rate
and the process's peak resident memory (anonymous memory and file pages separately).

Usage: python benchmarks/large_table.py [--quick] [--rows N] --json OUT.json   (also OUT.png)
(``SSL_REC_STORE_DIR`` picks the directory of the mapped store; default: a temp dir.)
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # `python benchmarks/large_table.py`: import the package from the root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks._fresh_process import run_in_fresh_process
from benchmarks._harness import Figure, Recording, benchmark_parser, pyplot


def measure(rows: int, store_dir: str, steps: int, batch: int = 4096) -> dict:
    """Run in a fresh process: train the table ``steps`` steps; speed, hit rate, memory."""
    import numpy as np
    import torch

    from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec

    torch.set_num_threads(1)
    spec = TableSpec("int8", cache_fraction=0.01, store_dir=store_dir or None)
    emb = MixedPrecisionEmbeddingCollection([rows], 64, spec, seed=0)
    rng = np.random.default_rng(0)
    ranks = (rng.zipf(1.1, (steps + 5) * batch) - 1) % rows
    perm = np.random.default_rng(1).permutation(min(rows, 1 << 24))
    ids = torch.from_numpy((perm[ranks % len(perm)] * (rows // len(perm))).reshape(-1, batch, 1))
    for step in range(steps + 5):
        if step == 5:
            start = time.perf_counter()
        emb(ids[step]).pow(2).sum().backward()
    seconds = time.perf_counter() - start
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)

    def mb(key: str) -> float:
        return int(status[key].split()[0]) / 1024

    return {"samples_per_s": steps * batch / seconds,
            "hit_rate": emb.cache_stats()["hit_rate"],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rss_anon_mb": mb("RssAnon"), "rss_file_mb": mb("RssFile")}  # fmt: skip


def run(rows: int, store_dir: str, steps: int) -> dict:
    """Measure one configuration in a fresh process."""
    return run_in_fresh_process(measure, rows, store_dir, steps)


def plot(results: dict) -> Figure:
    """Samples/s and resident memory (anonymous, file pages) of the two configurations."""
    plt = pyplot()
    names = ["mapped", "ram"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(7, 3))
    left.bar(names, [results[n]["samples_per_s"] / 1e3 for n in names])
    left.set_ylabel("k samples/s (1 thread)")
    anon = [results[n]["rss_anon_mb"] / 1024 for n in names]
    right.bar(names, anon, label="anonymous")
    right.bar(names, [results[n]["rss_file_mb"] / 1024 for n in names], bottom=anon,
              label="file pages")  # fmt: skip
    right.set_ylabel("resident GB at the end")
    right.legend()
    fig.suptitle(f"{results['rows'] / 1e6:.0f}M x {results['dim']} INT8, "
                 f"{results['cache_fraction']:.0%} FP32 cache")  # fmt: skip
    fig.tight_layout()
    return fig


def main() -> None:
    """Parse arguments, measure both configurations, print, write JSON + PNG."""
    parser = benchmark_parser(__doc__)
    parser.add_argument("--rows", type=int, default=None)
    args = parser.parse_args()
    record = Recording(__file__)
    rows = args.rows or (2_000_000 if args.quick else 100_000_000)
    steps = 50 if args.quick else 200
    with tempfile.TemporaryDirectory(dir=os.environ.get("SSL_REC_STORE_DIR")) as store:
        mapped = run(rows, store, steps)
    in_ram = run(rows, "", steps)
    ratio = mapped["samples_per_s"] / in_ram["samples_per_s"]
    results = {"rows": rows, "dim": 64, "cache_fraction": 0.01, "steps": steps,
               "mapped": mapped, "ram": in_ram, "mapped_vs_ram_samples": ratio}  # fmt: skip
    print(json.dumps(results, indent=2))
    record.write(args.json, results, plot, threads=1)


if __name__ == "__main__":
    main()
