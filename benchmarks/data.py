"""Data-path benchmark: loader samples/s and Criteo preprocessing rows/s.

Usage: python benchmarks/data.py [--quick] --json OUT.json   (also writes OUT.png)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from _figures import save_figure

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from ssl_rec._io import atomic_write_json
from ssl_rec.data import (
    BatchLoader,
    CriteoDataModule,
    SyntheticClickModel,
    SyntheticConfig,
    SyntheticCTRDataModule,
    write_criteo_tsv,
)
from ssl_rec.data.sources.synthetic import CHUNK_ROWS


def bench_loader(cache: str, n_rows: int, batch_sizes: list[int]) -> dict[int, float]:
    dm = SyntheticCTRDataModule(n_train=n_rows, n_val=1000, n_test=1000, cache_dir=cache)
    table = dm.split_table("train")
    out = {}
    for bs in batch_sizes:
        loader = BatchLoader(table, bs, shuffle=True)
        for _ in loader:  # warm the page cache
            pass
        t = time.perf_counter()
        n = sum(b.batch_size for b in loader)
        out[bs] = n / (time.perf_counter() - t)
    return out


def bench_preprocess(tmp: Path, n_rows: int) -> tuple[float, float]:
    gen = SyntheticClickModel(SyntheticConfig(cardinality_scale=0.01))
    path = tmp / "day_0.txt"
    with open(path, "wb") as f:
        for chunk, start in enumerate(range(0, n_rows, CHUNK_ROWS)):
            part = tmp / "part.txt"
            write_criteo_tsv(part, gen.rows("train", chunk, min(CHUNK_ROWS, n_rows - start)))
            f.write(part.read_bytes())
    t = time.perf_counter()
    dm = CriteoDataModule(str(path), cache_dir=str(tmp / "cache"))
    dm.schema  # noqa: B018
    dt = time.perf_counter() - t
    return n_rows / dt, path.stat().st_size / dt / 1e6


def plot(results: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    sizes = list(results["loader_by_batch_size"])
    ax.bar([str(s) for s in sizes], [results["loader_by_batch_size"][s] / 1e6 for s in sizes])
    ax.set_xlabel("batch size")
    ax.set_ylabel("loader M samples/s (1 process)")
    ax.set_title(f"Criteo preprocess: {results['criteo_preprocess_rows_per_s'] / 1e3:.0f}k rows/s")
    fig.tight_layout()
    save_figure(fig, png)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", required=True, type=Path)
    args = parser.parse_args()
    n_pre = 200_000 if args.quick else 1_000_000
    n_load = 500_000 if args.quick else 2_000_000
    with tempfile.TemporaryDirectory() as tmp:
        loader = bench_loader(str(Path(tmp) / "cache"), n_load, [4096, 16384, 65536])
        rows_s, mb_s = bench_preprocess(Path(tmp), n_pre)
    results = {
        "loader_samples_per_s": loader[4096],
        "loader_by_batch_size": loader,
        "criteo_preprocess_rows_per_s": rows_s,
        "criteo_preprocess_mb_per_s": mb_s,
        "preprocess_rows": n_pre,
        "loader_rows": n_load,
        "quick": args.quick,
    }
    print(f"{'measure':<36}{'value':>14}")
    for bs, v in loader.items():
        print(f"{f'loader samples/s (batch {bs})':<36}{v:>14,.0f}")
    print(f"{'criteo preprocess rows/s':<36}{rows_s:>14,.0f}")
    print(f"{'criteo preprocess MB/s':<36}{mb_s:>14,.1f}")
    atomic_write_json(args.json, results)
    plot(results, args.json.with_suffix(".png"))


if __name__ == "__main__":
    main()
