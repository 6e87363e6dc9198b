"""The wide term's start on a large log of sparse ids: logistic regression against zero.

``wide_init: auto`` (the own-data CTR configs) starts the wide term from logistic regression
where labeled rows are few: at most 20,000, or at most 10 per id of the fields
(:func:`ssl_rec.lightning.wide_prefit.wide_auto_start_reason`). MovieLens and the e-commerce
reviews (``benchmarks/real_data.py``) have a few thousand ids, so past 20,000 rows they hold
25 or more rows per id; a click log of many users and items seen a few times each does not.
This benchmark writes such a log (``--rows``, default 5M: users and items drawn by Zipf's
law, clicks from a user-item taste term, an item category and the price; 80/10/10 split
files), then trains ``configs/ctr/tabular.yaml`` with the README's own-data command at each
label fraction, once with ``--model.init_args.wide_init zero`` and once with ``logistic``,
at most ``--epochs`` epochs, the best validation epoch kept, and records both validation
AUCs, the test AUC of each, what ``auto`` chooses there and why, and the data's oracle AUC
(the true click probability's).

    python benchmarks/wide_start.py --json benchmarks/results/wide_start.json   # about 8 min
    python benchmarks/wide_start.py --quick --json /tmp/wide_start.json        # smoke run
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # `python benchmarks/wide_start.py`: import the package from the root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._harness import Figure, Recording, benchmark_parser, pyplot
from benchmarks.real_data import fit_args, library_run
from ssl_rec.lightning.wide_prefit import wide_auto_start_reason
from ssl_rec.metrics import binary_auc

ROOT = Path(__file__).resolve().parents[1]
CATEGORICAL = ["user", "item", "shop", "category", "device", "hour"]
DENSE = ["price", "age"]
STARTS = ("zero", "logistic")


def write_log(rows: int, directory: Path, seed: int = 7) -> float:
    """Write ``train/valid/test.parquet`` (80/10/10) of a ``rows``-row click log to ``directory``.

    Users (``rows / 5`` of them) and items (``rows / 25``) are drawn by Zipf's law, so most
    are seen a few times; a click's logit is half the dot product of 4-dim user and item
    tastes, plus an item category's effect, minus 0.3 log price, plus a device's; ``age`` is
    missing (null) in 5% of the rows.

    Returns:
        The oracle's test AUC (the true click logit as the score).
    """
    rng = np.random.default_rng(seed)
    users, items = max(rows // 5, 10), max(rows // 25, 10)

    def zipf(cardinality: int, exponent: float) -> np.ndarray:
        return rng.permutation(cardinality)[rng.zipf(exponent, rows) % cardinality]

    user, item = zipf(users, 1.1), zipf(items, 1.2)
    category, device = (item * 7) % 300, rng.integers(0, 5, rows)
    user_taste, item_taste = rng.normal(size=(users, 4)), rng.normal(size=(items, 4))
    category_effect = rng.normal(size=300) * 0.5
    price = np.exp(rng.normal(3.0, 1.0, rows))
    logit = (0.5 * (user_taste[user] * item_taste[item]).sum(1) + category_effect[category]
             - 0.3 * np.log(price) + 0.2 * (device == 1) - 1.5)  # fmt: skip
    clicked = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int8)
    age = rng.integers(18, 70, rows).astype(np.float64)
    table = pa.table({
        "clicked": clicked, "user": pa.array([f"u{u}" for u in user]), "item": item,
        "shop": item % 5000, "category": category, "device": device,
        "hour": rng.integers(0, 24, rows), "price": price,
        "age": pa.array(age, mask=rng.random(rows) < 0.05),
    })  # fmt: skip
    parts = np.split(rng.permutation(rows), [int(rows * 0.8), int(rows * 0.9)])
    for name, part in zip(("train", "valid", "test"), parts, strict=True):
        pq.write_table(table.take(pa.array(part)), directory / f"{name}.parquet")
    return binary_auc(logit[parts[2]], clicked[parts[2]])


def log_args(directory: Path) -> list[str]:
    """The README's own-data command on the log's split files."""
    return ["--config=configs/ctr/tabular.yaml", f"--data.path={directory}",
            "--data.label=clicked", f"--data.dense=[{','.join(DENSE)}]",
            f"--data.categorical=[{','.join(CATEGORICAL)}]"]  # fmt: skip


def _training_ids(directory: Path, cache: Path) -> tuple[int, int]:
    """``(training rows, ids of the fields)`` as the fits' data module counts them.

    The data block of ``configs/ctr/tabular.yaml`` (its preprocessing options), on the same
    cache the fits read.
    """
    import yaml

    from ssl_rec.data import TabularDataModule
    from ssl_rec.data.preprocess import PreprocessOptions

    block = yaml.safe_load((ROOT / "configs/common/data/tabular.yaml").read_text())
    options = PreprocessOptions(**block["init_args"].get("preprocess", {}))
    data = TabularDataModule(str(directory), "clicked", DENSE, CATEGORICAL, preprocess=options,
                             cache_dir=str(cache))  # fmt: skip
    return data.schema.metadata["splits"]["train"]["rows"], sum(data.schema.cardinalities)


def study(rows: int, fractions: list[float], epochs: int, seed: int) -> dict:
    """Both starts at every fraction on one log: the ``results`` of the JSON."""
    out: dict = {"rows": rows, "epochs": epochs, "seed": seed, "fractions": {}}
    with tempfile.TemporaryDirectory(prefix="wide_start_") as tmp:
        directory, cache, runs = (Path(tmp) / name for name in ("log", "cache", "runs"))
        directory.mkdir()
        out["oracle_test_auc"] = write_log(rows, directory)
        training, ids = _training_ids(directory, cache)
        out["ids"] = ids
        for fraction in fractions:
            labeled = max(1, round(training * fraction))  # as the data module draws them
            reason = wide_auto_start_reason(labeled, ids)
            record: dict = {"labeled_rows": labeled, "rows_per_id": labeled / ids,
                            "auto": "logistic" if reason is None else "zero",
                            "auto_reason": reason, "val_auc": {}, "test_auc": {},
                            "seconds": {}}  # fmt: skip
            for start in STARTS:
                began = time.time()
                fixed = [*log_args(directory), f"--model.init_args.wide_init={start}",
                         f"--trainer.max_epochs={epochs}"]  # fmt: skip
                val, test = library_run(fit_args(fixed, fraction, seed, str(cache), runs))
                record["val_auc"][start] = val
                record["test_auc"][start] = test()[0]
                record["seconds"][start] = round(time.time() - began, 1)
            val_auc = record["val_auc"]
            record["logistic_minus_zero_val"] = val_auc["logistic"] - val_auc["zero"]
            out["fractions"][f"{fraction:g}"] = record
            print(f"{fraction:g}: {record}", flush=True)
    return out


def plot(results: dict) -> Figure:
    """Validation AUC of both starts per label fraction, with what ``auto`` chooses."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    keys = list(results["fractions"])
    x = np.arange(len(keys))
    for i, start in enumerate(STARTS):
        ax.bar(x + (i - 0.5) * 0.35, [results["fractions"][k]["val_auc"][start] for k in keys],
               0.35, label=f"wide_init {start}")  # fmt: skip
    labels = [f"{float(k):.0%}\n{results['fractions'][k]['rows_per_id']:.2g} rows/id, "
              f"auto: {results['fractions'][k]['auto']}" for k in keys]  # fmt: skip
    ax.set_xticks(x, labels, fontsize=8)
    low = min(min(results["fractions"][k]["val_auc"].values()) for k in keys)
    ax.set_ylim(low - 0.02, None)
    ax.set_ylabel("validation AUC")
    ax.set_title(f"{results['rows']:,}-row log, {results['ids']:,} ids", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def main() -> None:
    """Parse arguments, run the study, write JSON + PNG."""
    parser = benchmark_parser(__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=None, help="log rows (default 5M; --quick 20k)")
    parser.add_argument("--epochs", type=int, default=None, help="epoch cap (default 2; --quick 1)")
    parser.add_argument("--seed", type=int, default=0, help="labeled subset and model seed")
    args = parser.parse_args()
    record = Recording(__file__)
    os.environ.setdefault("WANDB_MODE", "offline")
    rows = args.rows or (20_000 if args.quick else 5_000_000)
    fractions = [0.1, 1.0] if args.quick else [0.01, 0.1, 1.0]
    results = study(rows, fractions, args.epochs or (1 if args.quick else 2), args.seed)
    record.write(args.json, results, plot)


if __name__ == "__main__":
    main()
