"""Data-path benchmark: loader samples/s (one file vs sharded), Criteo preprocessing rows/s and
peak memory at Criteo-Kaggle cardinalities.

Usage: python benchmarks/data.py [--quick | --full] --json OUT.json   (also writes OUT.png)

- preprocessing throughput of generated rows in the exact Criteo TSV layout at
  ``cardinality_scale`` 0.01 and 1.0 (Criteo-Kaggle's vocabularies), one process;
- peak resident memory of preprocessing a 2M- and a 10M-row file at scale 1.0, each in a
  fresh process (flat in rows: memory follows the vocabularies, not the row count), and of a
  one-step ``ssl-rec fit --config configs/ctr/criteo.yaml`` on them (its INT8 + 5% cache
  tables, and the same model with FP32 tables);
- ``--full`` (not in CI; instead of the above): a 45.8M-row Criteo-Kaggle-shaped file
  (11 GB, generated chunk by chunk, deleted afterwards) preprocessed end to end in a fresh
  process (time, rows/s and peak memory), then one epoch of ``ssl-rec fit --config
  configs/ctr/criteo.yaml`` on it in a fresh process: its wall time (preprocessing with the
  config's options included), training and validation time, samples/s and peak memory. With
  ``--epoch_minutes M`` training stops after M minutes and the epoch is extrapolated from
  that stretch (``kaggle_epoch_extrapolated``: true).
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # `python benchmarks/data.py`: import the package from the root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from benchmarks._fresh_process import run_in_fresh_process
from benchmarks._harness import Figure, Recording, benchmark_parser, pyplot
from ssl_rec.data import (
    BatchLoader,
    CriteoDataModule,
    SyntheticClickModel,
    SyntheticConfig,
    SyntheticCTRDataModule,
    write_criteo_tsv,
)
from ssl_rec.data.sources.synthetic import CHUNK_ROWS

ROOT = Path(__file__).resolve().parent.parent
KAGGLE_ROWS = 45_840_617


def bench_loader(cache: str, n_rows: int, batch_sizes: list[int],
                 repeats: int = 3) -> dict[str, dict[int, float]]:  # fmt: skip
    """Samples/s of one shard vs the same split in shards of n/8 rows (block shuffle).

    The two layouts are timed alternately, ``repeats`` epochs each, and the best epoch of
    each counts, so load from other processes on a shared machine hits both alike.
    """
    tables = {}
    for name, shard_rows in (("single", n_rows), ("sharded", n_rows // 8)):
        dm = SyntheticCTRDataModule(n_train=n_rows, n_val=1000, n_test=1000,
                                    cache_dir=f"{cache}-{name}")  # fmt: skip
        _reshard(dm, shard_rows)
        tables[name] = dm.split_table("train")
        for _ in BatchLoader(tables[name], batch_sizes[0]):  # warm the page cache
            pass
    out: dict[str, dict[int, float]] = {name: {} for name in tables}
    for bs in batch_sizes:
        for _ in range(repeats):
            for name, table in tables.items():
                t = time.perf_counter()
                n = sum(b.batch_size for b in BatchLoader(table, bs, shuffle=True))
                best = out[name].get(bs, 0.0)
                out[name][bs] = max(best, n / (time.perf_counter() - t))
    return out


def _reshard(dm: SyntheticCTRDataModule, shard_rows: int) -> None:
    import pyarrow as pa

    from ssl_rec.data.storage import ShardWriter, write_entry_checksums

    folder = dm.data_dir / "train"
    table = dm.split_table("train")
    dm._splits.clear()
    staged = dm.data_dir / "train-resharded"
    with ShardWriter(staged, table.schema, shard_rows) as writer:
        for batch in table.to_batches(1 << 16):
            writer.write(pa.RecordBatch.from_arrays(batch.columns, schema=table.schema))
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()
    staged.rename(folder)
    write_entry_checksums(dm.data_dir)  # the entry's record now names the new shards


def write_file(path: Path, n_rows: int, scale: float) -> Path:
    """``n_rows`` generated rows in the exact Criteo layout (chunk by chunk)."""
    gen = SyntheticClickModel(SyntheticConfig(cardinality_scale=scale))
    with open(path, "wb") as f:
        for chunk, start in enumerate(range(0, n_rows, CHUNK_ROWS)):
            part = path.with_suffix(".part")
            write_criteo_tsv(part, gen.rows("train", chunk, min(CHUNK_ROWS, n_rows - start)))
            f.write(part.read_bytes())
            part.unlink()
    return path


def peak_rss_mb() -> float:
    """Peak RSS (MB) of this process's own address space: /proc's VmHWM.

    ``ru_maxrss`` would also count the parent's resident memory at the fork (Linux carries
    it across exec).
    """
    with open("/proc/self/status") as status:
        return int(next(ln for ln in status if ln.startswith("VmHWM")).split()[1]) / 1024


def preprocess(path: str, cache: str) -> tuple[float, float]:
    """Run in a fresh process: ``(seconds, peak RSS MB)`` of preprocessing ``path``."""
    t = time.perf_counter()
    CriteoDataModule(path, cache_dir=cache).schema  # noqa: B018 - reading it preprocesses
    return time.perf_counter() - t, peak_rss_mb()


def preprocess_in_child(path: Path, cache: Path, rows: int | None = None) -> tuple[float, float]:
    """``(rows/s, peak RSS MB)`` of preprocessing ``path`` (``rows`` lines) in a fresh process."""
    seconds, peak = run_in_fresh_process(preprocess, str(path), str(cache))
    if rows is None:
        rows = sum(1 for _ in open(path, "rb"))
    return rows / seconds, peak


def fit(args: list[str]) -> float:
    """Run in a fresh process: the ``ssl-rec`` command with ``args``; the peak RSS (MB) after."""
    sys.argv = ["ssl-rec", *args]
    runpy.run_module("ssl_rec.cli.main", run_name="__main__")
    return peak_rss_mb()


# The shipped config's tables are INT8 + 5% FP32 cache; the same model with FP32 tables too.
_TABLES = "--model.init_args.backbone.init_args.tables."
FP32_TABLES = [f"{_TABLES}precision", "fp32", f"{_TABLES}cache_fraction", "0",
               f"{_TABLES}stochastic_rounding", "false"]  # fmt: skip


def fit_peak_rss(path: Path, tmp: Path, extra: list[str] | None = None) -> float:
    """Peak RSS (MB) of a one-step ``ssl-rec fit`` with the shipped Criteo config (+ ``extra``)."""
    args = ["fit", "--config", "configs/ctr/criteo.yaml", *(extra or []), "--data.path", str(path),
            "--data.cache_dir", str(tmp / "fit-cache"), "--trainer.max_steps", "1",
            "--trainer.limit_val_batches", "1", "--trainer.logger", "false",
            "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir",
            str(tmp / "fit-run")]  # fmt: skip
    return run_in_fresh_process(fit, args, cwd=ROOT)


def plot(results: dict) -> Figure:
    """Loader samples/s by batch size; the preprocessing rate in the title."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3))
    sizes = list(results["loader_by_batch_size"])
    ax.bar([str(s) for s in sizes], [results["loader_by_batch_size"][s] / 1e6 for s in sizes])
    ax.set_xlabel("batch size")
    ax.set_ylabel("loader M samples/s (1 process)")
    ax.set_title(f"Criteo preprocess: {results['criteo_preprocess_rows_per_s'] / 1e3:.0f}k rows/s")
    fig.tight_layout()
    return fig


def regular(tmp: Path, small: int, big: int) -> dict:
    """Loader, throughput and memory figures on ``small`` / ``big``-row files."""
    results: dict = {}
    loader = bench_loader(str(tmp / "cache"), small, [4096, 16384, 65536])
    results["loader_samples_per_s"] = loader["single"][4096]
    results["loader_by_batch_size"] = loader["single"]
    results["loader_sharded_samples_per_s"] = loader["sharded"][4096]
    results["loader_sharded_ratio"] = loader["sharded"][4096] / loader["single"][4096]
    scale01 = write_file(tmp / "s001.txt", small // 2, 0.01)
    results["criteo_preprocess_rows_per_s"], _ = preprocess_in_child(scale01, tmp / "c0")
    files = {n: write_file(tmp / f"s1-{n}.txt", n, 1.0) for n in (small, big)}
    for n, path in files.items():
        rows_s, peak = preprocess_in_child(path, tmp / f"c{n}")
        key = "2m" if n == small else "10m"
        results[f"preprocess_peak_rss_mb_{key}"] = peak
        if n == small:
            results["criteo_preprocess_rows_per_s_scale1"] = rows_s
        results[f"fit_peak_rss_mb_{key}"] = fit_peak_rss(path, tmp / f"f{n}")
        results[f"fit_fp32_peak_rss_mb_{key}"] = fit_peak_rss(path, tmp / f"g{n}", FP32_TABLES)
        path.unlink()
    for prefix in ("preprocess", "fit", "fit_fp32"):
        results[f"{prefix}_peak_rss_ratio"] = (
            results[f"{prefix}_peak_rss_mb_10m"] / results[f"{prefix}_peak_rss_mb_2m"]
        )
    return results


def full(tmp: Path, epoch_minutes: float | None = None) -> dict:
    """The 45.8M-row Criteo-Kaggle-shaped file preprocessed end to end (file then deleted)."""
    t = time.perf_counter()
    kaggle = write_file(tmp / "kaggle.txt", KAGGLE_ROWS, 1.0)
    results = {"kaggle_rows": KAGGLE_ROWS, "kaggle_file_gb": kaggle.stat().st_size / 1e9,
               "kaggle_generate_seconds": time.perf_counter() - t}  # fmt: skip
    rows_s, peak = preprocess_in_child(kaggle, tmp / "ck", KAGGLE_ROWS)
    shutil.rmtree(tmp / "ck")
    results["kaggle_preprocess_seconds"] = KAGGLE_ROWS / rows_s
    results["kaggle_preprocess_rows_per_s"] = rows_s
    results["kaggle_preprocess_peak_rss_mb"] = peak
    results.update(kaggle_epoch(kaggle, tmp, epoch_minutes))
    kaggle.unlink()
    return results


def kaggle_epoch(path: Path, tmp: Path, minutes: float | None) -> dict:
    """One epoch of the shipped Criteo config on ``path``, timed by :class:`EpochClock`.

    ``minutes`` (whole minutes): stop training after that long and extrapolate the epoch's
    training from the measured stretch (its rate times the epoch's steps); Lightning then
    skips the epoch's validation, so the hours count training only. ``None``: run the epoch
    to the end, validation included.
    """
    clock = tmp / "epoch_clock.json"
    extra = ["--trainer.callbacks+={\"class_path\": \"benchmarks._epoch_clock.EpochClock\", "
             f"\"init_args\": {{\"out\": \"{clock}\"}}}}"]  # fmt: skip
    if minutes is not None:
        hours, mins = divmod(int(minutes), 60)
        extra += ["--trainer.max_time", f"00:{hours:02d}:{mins:02d}:00"]
    t = time.perf_counter()
    peak = run_in_fresh_process(fit, ["fit", "--config", "configs/ctr/criteo.yaml", *extra,
                                      "--data.path", str(path), "--data.cache_dir",
                                      str(tmp / "fit-cache"), "--trainer.logger", "false",
                                      "--trainer.enable_progress_bar", "false",
                                      "--trainer.default_root_dir", str(tmp / "fit-run")],
                                cwd=ROOT)  # fmt: skip
    wall = time.perf_counter() - t
    figures = json.loads(clock.read_text())
    steps, done = figures["steps_per_epoch"], figures["train_steps"]
    train = figures["train_seconds"] * (steps / done if figures["stopped_early"] else 1.0)
    return {
        "kaggle_epoch_command": "ssl-rec fit --config configs/ctr/criteo.yaml --data.path FILE",
        "kaggle_epoch_extrapolated": figures["stopped_early"],
        "kaggle_epoch_fit_wall_seconds": wall,
        "kaggle_epoch_train_seconds": train,
        "kaggle_epoch_measured_train_seconds": figures["train_seconds"],
        "kaggle_epoch_train_steps": done,
        "kaggle_epoch_steps_per_epoch": steps,
        "kaggle_epoch_train_samples_per_s": figures["train_samples"] / figures["train_seconds"],
        "kaggle_epoch_val_seconds": None if figures["stopped_early"] else figures["val_seconds"],
        "kaggle_epoch_val_samples": figures["val_samples"],
        "kaggle_epoch_hours": (train + figures["val_seconds"]) / 3600,
        "kaggle_epoch_peak_rss_mb": peak,
    }


def main() -> None:
    """Parse arguments, run the regular or the ``--full`` measurements, write JSON + PNG."""
    parser = benchmark_parser(__doc__)
    parser.add_argument("--full", action="store_true", help="only the 45.8M-row Kaggle file")
    parser.add_argument("--epoch_minutes", type=float, default=None,
                        help="with --full: stop the epoch after this many minutes of training "
                        "and extrapolate (default: run it to the end)")  # fmt: skip
    args = parser.parse_args()
    if args.quick and args.full:
        parser.error("--quick and --full exclude each other")
    if args.epoch_minutes is not None and (not args.full or args.epoch_minutes < 10):
        parser.error("--epoch_minutes needs --full and at least 10 minutes")
    record = Recording(__file__)
    small, big = (200_000, 1_000_000) if args.quick else (2_000_000, 10_000_000)
    results: dict = {"quick": args.quick}
    with tempfile.TemporaryDirectory(dir=os.environ.get("SSL_REC_BENCH_TMP")) as tmp:
        if args.full:
            results.update(full(Path(tmp), args.epoch_minutes))
        else:
            results.update(regular(Path(tmp), small, big))
    for key, value in results.items():
        print(f"{key:<40}{value}")
    record.write(args.json, results, None if args.full else plot)


if __name__ == "__main__":
    main()
