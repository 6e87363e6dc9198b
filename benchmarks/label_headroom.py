"""How much of the labels' value rows without labels could stand in for, per real dataset.

The real-data study (``benchmarks/real_data.py``) trains on a fraction of a split's training
labels; the rest of the training rows are the unlabeled rows a semi-supervised run reads.
This benchmark asks what those rows can tell a click model about each id, with the study's
peer, scikit-learn's logistic regression on one-hot ids and standardized dense columns (``C``
chosen on validation AUC), on the study's splits and labeled subsets (split seed = seed):

- ``labeled``: the labeled rows' features alone (the study's peer);
- ``id_statistics``: plus, for each field, every id's statistics over all training rows with
  the labels unused: log(1 + count), and the mean and standard deviation of each dense column
  over the id's rows (the first and second moments of what the rows say about an id
  without labels);
- ``unlabeled_label_rate``: plus, for each field, every id's label rate in the *unlabeled*
  training rows, their labels revealed (shrunk to the overall rate by 10 pseudo-rows; the
  labeled rows' own labels are not in it): what knowing each id's outcome from those rows
  would be worth, the ceiling of what they could add through per-id knowledge.

``id_statistics - labeled`` is what the unlabeled rows' per-id statistics add;
``unlabeled_label_rate - labeled`` is the room there is. Every variant's test AUC is computed
once, for the ``C`` of best validation AUC; differences are paired per seed.

    python benchmarks/label_headroom.py --json benchmarks/results/label_headroom.json  # ~3 min
    python benchmarks/label_headroom.py --quick --json /tmp/label_headroom.json     # smoke run
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

if not __package__:  # `python benchmarks/label_headroom.py`: import the package from the root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import numpy as np
import pyarrow as pa

from benchmarks._harness import Figure, Recording, benchmark_parser, chosen_seeds, pyplot
from benchmarks._peers import DATA_MODULES, logistic_regression
from benchmarks._selection import mean_std, seed_diffs
from ssl_rec.data.arrow_data_module import labeled_subset
from ssl_rec.data.loader import fixed_list_to_numpy
from ssl_rec.data.storage import DENSE, LABEL, SPARSE

VARIANTS = ("labeled", "id_statistics", "unlabeled_label_rate")
C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
SHRINK_ROWS = 10.0
SEEDS = (0, 1, 2)
Rows = tuple[np.ndarray, np.ndarray, np.ndarray]  # dense float[n, d], ids int[n, F], label[n]


def split_rows(table: pa.Table) -> Rows:
    """``(dense, ids, label)`` of a preprocessed split, in the table's row order."""
    dense, ids = (fixed_list_to_numpy(table.column(c)) for c in (DENSE, SPARSE))
    label = np.array(table.column(LABEL).to_numpy(), dtype=np.float64)
    return dense.astype(np.float64), ids.astype(np.int64), label


def id_statistics(rows: Rows, cardinalities: list[int]) -> list[np.ndarray]:
    """Per field, ``float[cardinality, 1 + 2 d]``: log(1 + count), dense means, dense stds.

    Computed from ``rows`` without their labels; an id without rows gets count 0 and the
    overall means and standard deviations.
    """
    dense, ids, _ = rows
    out = []
    for field, cardinality in enumerate(cardinalities):
        column = ids[:, field]
        count = np.bincount(column, minlength=cardinality).astype(np.float64)
        seen = np.maximum(count, 1.0)[:, None]
        sums = np.stack([np.bincount(column, d, cardinality) for d in dense.T], 1)
        squares = np.stack([np.bincount(column, d * d, cardinality) for d in dense.T], 1)
        mean = np.where(count[:, None] > 0, sums / seen, dense.mean(0))
        var = np.where(count[:, None] > 1, squares / seen - mean**2, dense.var(0))
        out.append(np.hstack([np.log1p(count)[:, None], mean, np.sqrt(np.maximum(var, 0.0))]))
    return out


def label_rates(rows: Rows, cardinalities: list[int]) -> list[np.ndarray]:
    """Per field, ``float[cardinality, 1]``: each id's label rate in ``rows``, shrunk.

    ``(clicks + k p) / (rows + k)`` with ``p`` the overall rate and ``k`` = ``SHRINK_ROWS``.
    """
    _, ids, label = rows
    prior = float(label.mean())
    out = []
    for field, cardinality in enumerate(cardinalities):
        column = ids[:, field]
        count = np.bincount(column, minlength=cardinality)
        clicks = np.bincount(column, label.astype(np.float64), cardinality)
        out.append(((clicks + SHRINK_ROWS * prior) / (count + SHRINK_ROWS))[:, None])
    return out


def features(rows: Rows, per_id: list[np.ndarray] | None):  # noqa: ANN201 - a scipy matrix
    """The regression's unscaled inputs: dense columns, then each field's per-id columns."""
    dense, ids, _ = rows
    extra = [] if per_id is None else [table[ids[:, f]] for f, table in enumerate(per_id)]
    return np.hstack([dense, *extra])


def fit_variant(labeled: Rows, val: Rows, test: Rows, per_id: list[np.ndarray] | None) -> dict:
    """The study's logistic-regression peer given the per-id columns too, ``C`` chosen on
    validation.

    Returns:
        ``{"C", "val_auc", "test_auc"}``; test AUC only for the chosen ``C``.
    """
    data = {split: (features(rows, per_id), rows[1], rows[2])
            for split, rows in (("train", labeled), ("val", val), ("test", test))}  # fmt: skip
    runs = {c: logistic_regression(data, c) for c in C_GRID}
    chosen = max(runs, key=lambda c: runs[c][0])
    return {"C": chosen, "val_auc": runs[chosen][0], "test_auc": runs[chosen][1]()}


def seed_run(dataset: str, seed: int, fractions: list[float], cache: str) -> dict:
    """Every variant at every fraction on the split of ``seed``: ``fraction -> variant -> fit``."""
    data = DATA_MODULES[dataset](cache_dir=cache, split_seed=seed, seed=seed)
    cardinalities = list(data.schema.cardinalities)
    train, val, test = (split_rows(data.split_table(s)) for s in ("train", "val", "test"))
    statistics = id_statistics(train, cardinalities)
    out: dict = {}
    for fraction in fractions:
        chosen = labeled_subset(len(train[2]), fraction, seed)
        rest = np.setdiff1d(np.arange(len(train[2])), chosen)
        labeled = tuple(a[chosen] for a in train)
        per_id = {"labeled": None, "id_statistics": statistics}
        if len(rest):
            per_id["unlabeled_label_rate"] = label_rates(
                tuple(a[rest] for a in train), cardinalities
            )
        out[f"{fraction:g}"] = {name: fit_variant(labeled, val, test, table)
                                for name, table in per_id.items()}  # fmt: skip
        print(
            f"{dataset} seed {seed} {fraction:g}: "
            + ", ".join(f"{k} {v['test_auc']:.4f}" for k, v in out[f"{fraction:g}"].items()),
            flush=True,
        )
    return out


def summarize(per_seed: dict[int, dict]) -> dict:
    """``fraction -> {"variants": name -> test AUC mean/std, "paired": name - labeled}``."""
    out: dict = {}
    for fraction in next(iter(per_seed.values())):
        fits = {s: per_seed[s][fraction] for s in per_seed}
        names = [v for v in VARIANTS if all(v in f for f in fits.values())]
        tests = {v: {s: fits[s][v]["test_auc"] for s in fits} for v in names}
        out[fraction] = {
            "variants": {v: {**mean_std(list(tests[v].values())),
                             "val_auc": mean_std([fits[s][v]["val_auc"] for s in fits])["mean"]}
                         for v in names},
            "paired": {f"{v} - labeled": seed_diffs(tests[v], tests["labeled"])
                       for v in names if v != "labeled"},
        }  # fmt: skip
    return out


def plot(results: dict) -> Figure:
    """Test AUC of each variant per dataset and label fraction."""
    plt = pyplot()
    datasets = list(results["datasets"])
    fig, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 3.5), squeeze=False)
    for ax, dataset in zip(axes[0], datasets, strict=True):
        summary = results["datasets"][dataset]["summary"]
        keys = list(summary)
        x = np.arange(len(keys))
        for i, variant in enumerate(VARIANTS):
            means = [summary[k]["variants"].get(variant, {}).get("mean", np.nan) for k in keys]
            ax.bar(x + (i - 1) * 0.27, means, 0.27, label=variant)
        ax.set_xticks(x, [f"{float(k):.0%} labels" for k in keys])
        low = np.nanmin([v["mean"] for k in keys for v in summary[k]["variants"].values()])
        ax.set_ylim(low - 0.03, None)
        ax.set_ylabel("test AUC (logistic regression)")
        ax.set_title(dataset, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main() -> None:
    """Parse arguments, run every dataset and seed, write JSON + PNG."""
    parser = benchmark_parser(__doc__.splitlines()[0], seeds=True)
    parser.add_argument("--dataset", nargs="+", choices=sorted(DATA_MODULES),
                        help="default: both (--quick: ecommerce)")  # fmt: skip
    parser.add_argument("--cache-dir", default=None, help="data cache (default: a temporary one)")
    args = parser.parse_args()
    record = Recording(__file__)
    datasets = args.dataset or (["ecommerce"] if args.quick else sorted(DATA_MODULES))
    seeds = chosen_seeds(args, SEEDS)
    fractions = [0.1] if args.quick else [0.01, 0.1, 1.0]
    results: dict = {"fractions": fractions, "seeds": list(seeds), "c_grid": list(C_GRID),
                     "shrink_rows": SHRINK_ROWS, "datasets": {}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="label_headroom_") as tmp:
        cache = args.cache_dir or os.path.join(tmp, "cache")
        for dataset in datasets:
            per_seed = {s: seed_run(dataset, s, fractions, cache) for s in seeds}
            results["datasets"][dataset] = {"per_seed": per_seed, "summary": summarize(per_seed)}
    record.write(args.json, results, plot)
    for dataset, entry in results["datasets"].items():
        for fraction, summary in entry["summary"].items():
            gains = ", ".join(f"{k} {v['mean']:+.4f} ± {v['std']:.4f} ({v['wins']}/{v['n']})"
                              for k, v in summary["paired"].items())  # fmt: skip
            print(
                f"{dataset} {float(fraction):.0%}: labeled "
                f"{summary['variants']['labeled']['mean']:.4f}; {gains}"
            )


if __name__ == "__main__":
    main()
