"""A table larger than RAM: INT8 store memory-mapped from disk, 1% FP32 cache in RAM.

Trains one ``rows x 64`` INT8 table (100M rows = 7.2 GB of store; 25.6 GB in FP32) with
row-wise Adagrad on Zipf-distributed ids, once with the store in RAM and once memory-mapped
(``TableSpec.store_dir``), each in a fresh process; reports samples/s, the cache hit rate
and the process's peak resident memory (anonymous memory and file pages separately).

Usage: python benchmarks/large_table.py [--quick] [--rows N] --json OUT.json   (also OUT.png)
(``SSL_REC_STORE_DIR`` picks the directory of the mapped store; default: a temp dir.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _figures import save_figure

from ssl_rec._io import atomic_write_json

CHILD = """
import json, resource, sys, time
import numpy as np, torch
from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec
rows, store_dir, steps, batch = int(sys.argv[1]), sys.argv[2] or None, int(sys.argv[3]), 4096
torch.set_num_threads(1)
spec = TableSpec("int8", cache_fraction=0.01, store_dir=store_dir)
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
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
kb = lambda key: int(status[key].split()[0]) / 1024
print(json.dumps({"samples_per_s": steps * batch / seconds,
                  "hit_rate": emb.cache_stats()["hit_rate"],
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rss_anon_mb": kb("RssAnon"), "rss_file_mb": kb("RssFile")}))
"""


def run(rows: int, store_dir: str, steps: int) -> dict:
    """Measure one configuration in a fresh process."""
    out = subprocess.run([sys.executable, "-c", CHILD, str(rows), store_dir, str(steps)],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def plot(results: dict, png: Path) -> None:
    """Samples/s and resident memory (anonymous, file pages) of the two configurations."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    save_figure(fig, png)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--json", required=True, type=Path)
    args = parser.parse_args()
    rows = args.rows or (2_000_000 if args.quick else 100_000_000)
    steps = 50 if args.quick else 200
    with tempfile.TemporaryDirectory(dir=os.environ.get("SSL_REC_STORE_DIR")) as store:
        mapped = run(rows, store, steps)
    in_ram = run(rows, "", steps)
    ratio = mapped["samples_per_s"] / in_ram["samples_per_s"]
    results = {"rows": rows, "dim": 64, "cache_fraction": 0.01, "steps": steps,
               "mapped": mapped, "ram": in_ram, "mapped_vs_ram_samples": ratio}  # fmt: skip
    print(json.dumps(results, indent=2))
    atomic_write_json(args.json, results)
    plot(results, args.json.with_suffix(".png"))


if __name__ == "__main__":
    main()
