"""Vocabulary in checkpoints: size and save/load time at a few million raw values.

A checkpoint carries the model's vocabulary as UTF-8 bytes + offsets tensors
(``Vocabularies.to_state``); this measures ``torch.save`` / ``torch.load(weights_only=True)``
of it, and of the Arrow file exports and caches hold, against the raw bytes of the values.

Usage: python benchmarks/vocabulary.py [--quick] --json OUT.json   (also writes OUT.png)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # `python benchmarks/vocabulary.py`: import the package from the root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import numpy as np
import pyarrow as pa
import torch

from benchmarks._harness import Figure, Recording, benchmark_parser, pyplot
from ssl_rec.vocab import Vocabularies, Vocabulary

FIELDS = 26


def make_vocabulary(n_values: int) -> Vocabularies:
    """``n_values`` Criteo-like 8-hex-digit values spread over 26 fields (Zipf-sized)."""
    sizes = np.maximum(1, (n_values / np.arange(1, FIELDS + 1) ** 1.2)).astype(np.int64)
    sizes = (sizes * n_values // sizes.sum()).clip(1)
    fields = {}
    for f, n in enumerate(sizes):
        codes = np.arange(n, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(f)
        values = pa.array(np.char.mod("%08x", codes & np.uint64(0xFFFFFFFF)))
        fields[f"C{f + 1}"] = Vocabulary(values, np.arange(1, n + 1, dtype=np.int32), n + 1, False)
    return Vocabularies(fields)


def bench(n_values: int, tmp: Path) -> dict[str, float]:
    """Times (s) and sizes (MB) of the checkpoint and Arrow forms of one vocabulary."""
    vocab = make_vocabulary(n_values)
    raw_mb = sum(len(v.values) * 8 for v in vocab.fields.values()) / 1e6  # 8 hex digits each
    path, arrow = tmp / "vocab.pt", tmp / "vocab.arrow"
    t = time.perf_counter()
    torch.save(vocab.to_state(), path)
    save_s = time.perf_counter() - t
    t = time.perf_counter()
    back = Vocabularies.from_state(torch.load(path, weights_only=True))
    load_s = time.perf_counter() - t
    assert back.cardinalities == vocab.cardinalities
    t = time.perf_counter()
    vocab.save(arrow)
    arrow_save_s = time.perf_counter() - t
    t = time.perf_counter()
    Vocabularies.load(arrow)
    arrow_load_s = time.perf_counter() - t
    return {"values": n_values, "raw_mb": raw_mb, "checkpoint_mb": path.stat().st_size / 1e6,
            "save_s": save_s, "load_s": load_s, "arrow_mb": arrow.stat().st_size / 1e6,
            "arrow_save_s": arrow_save_s, "arrow_load_s": arrow_load_s}  # fmt: skip


def plot(results: list[dict[str, float]]) -> Figure:
    """Save and load seconds of both forms against the number of values."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3))
    n = [r["values"] / 1e6 for r in results]
    for key, label in (("save_s", "checkpoint save"), ("load_s", "checkpoint load"),
                       ("arrow_save_s", "Arrow save"), ("arrow_load_s", "Arrow load")):  # fmt: skip
        ax.plot(n, [r[key] for r in results], marker="o", label=label)
    ax.set_xlabel("raw values (millions)")
    ax.set_ylabel("seconds")
    ax.legend()
    fig.tight_layout()
    return fig


def main() -> None:
    """Parse arguments, measure each size, print a table, write JSON + PNG."""
    args = benchmark_parser(__doc__).parse_args()
    record = Recording(__file__)
    counts = [250_000, 1_000_000] if args.quick else [1_000_000, 2_000_000, 4_000_000]
    with tempfile.TemporaryDirectory() as tmp:
        results = [bench(n, Path(tmp)) for n in counts]
    print(f"{'values':>10}{'raw MB':>8}{'ckpt MB':>9}{'save s':>8}{'load s':>8}{'arrow MB':>10}")
    for r in results:
        print(f"{r['values']:>10,}{r['raw_mb']:>8.1f}{r['checkpoint_mb']:>9.1f}"
              f"{r['save_s']:>8.2f}{r['load_s']:>8.2f}{r['arrow_mb']:>10.1f}")  # fmt: skip
    plain = [{k: float(v) for k, v in r.items()} for r in results]
    record.write(args.json, {"results": plain, "quick": args.quick}, lambda r: plot(r["results"]))


if __name__ == "__main__":
    main()
