"""Start a Wide & Deep model from logistic regression: the wide term fitted before the first step.

With few labels, logistic regression on one-hot ids is hard to beat and a deep model trained
by SGD with early stopping is a noisier estimate of the same per-id effects. Fitting the wide
term first (full-batch, its L2 strength chosen on validation AUC), freezing it and starting
the click head's output at zero makes training begin at that model; the deep part then learns
only what the linear model misses, and early stopping on validation keeps it from undoing it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.rank_zero import rank_zero_info
from torch import nn

from ssl_rec.metrics import binary_auc
from ssl_rec.models.logistic_fit import LogisticFit, fit_logistic
from ssl_rec.models.wide import WideTerm, hold_wide_term
from ssl_rec.quantize.scoring import Rows
from ssl_rec.types import Batch

__all__ = [
    "WIDE_AUTO_MAX_IDS",
    "WIDE_AUTO_MAX_ROWS",
    "WIDE_AUTO_ROWS_PER_ID",
    "WIDE_FIT_ROWS",
    "WIDE_INVERSE_STRENGTHS",
    "WideFitState",
    "count_wide_ids",
    "prefit_wide",
    "start_wide_term",
    "wide_auto_start_reason",
]

# The grid of scikit-learn's C the fit chooses from on validation AUC, and how many labeled
# rows it reads at most (the first of the shuffled training order): on one core the grid
# takes about 12 s on 20,000 rows of 26 fields of 20,000 ids each and 2.3 min on 200,000 rows
# of 26 fields of 100,000 ids (3 GB peak, mostly L-BFGS's history).
WIDE_INVERSE_STRENGTHS = (0.01, 0.1, 1.0, 10.0)
WIDE_FIT_ROWS = 200_000
# wide_init="auto" starts from the regression on at most WIDE_AUTO_MAX_ROWS labeled training
# rows, or on at most WIDE_AUTO_ROWS_PER_ID labeled rows per id of the fields (the sum of their
# cardinalities) where they hold at most WIDE_AUTO_MAX_IDS ids (the fit's memory grows with
# them). Measured on validation (docs/PERFORMANCE.md, "Starting the wide term from logistic
# regression"): ahead at 800 and 8,000 MovieLens rows (0.25 and 2.5 rows per id), level at
# 18,789 e-commerce rows (28 per id), behind at 80,000 MovieLens rows (25 per id); ahead at
# 40k, 400k and 4M labeled rows of a 5M-row table of 532k ids (0.08, 0.75 and 7.5 per id).
WIDE_AUTO_MAX_ROWS = 20_000
WIDE_AUTO_ROWS_PER_ID = 10
WIDE_AUTO_MAX_IDS = 2_000_000


class WideFitState(enum.IntEnum):
    """What a fit's start decided for the wide term (a buffer of the module, so it is saved)."""

    pending = 0  # not started yet
    fitted = 1  # fitted as logistic regression, held
    trained = 2  # ``auto`` on many labeled rows per id (wide_auto_start_reason): zero start


@torch.no_grad()
def _load(fit: LogisticFit, wide: WideTerm, output: nn.Linear) -> None:
    wide.ids.load_weights([w.unsqueeze(1) for w in fit.ids])
    wide.load_linear_weights(fit.dense)
    output.weight.zero_()
    output.bias.fill_(fit.bias)


def prefit_wide(
    wide: WideTerm,
    output: nn.Linear,
    cardinalities: Sequence[int],
    train: Rows,
    val: Iterable[Batch],
    inverse_strengths: Sequence[float] = WIDE_INVERSE_STRENGTHS,
    max_rows: int = WIDE_FIT_ROWS,
) -> dict[str, Any]:
    """Fit ``wide`` as logistic regression, ``C`` chosen on validation AUC; zero ``output``.

    Args:
        wide: the model's wide term; its id scalars, dense weights and count slopes are
            overwritten (its count features must be set: they are columns of the fit).
        output: the click head's output layer (one unit): weights zeroed, bias set to the
            fit's intercept, so the model's logit is the fitted regression's.
        cardinalities: ids per field (the schema's).
        train: the labeled training rows.
        val: validation batches (up to ``max_rows`` rows), where ``C`` is chosen.
        inverse_strengths: the ``C`` values tried (see :func:`fit_logistic`).
        max_rows: validation rows read at most.

    Returns:
        ``{"inverse_strength": C, "val_auc": {C: AUC}, "rows": N}``; a term with
        co-occurrence factors also tries every ``C`` without them and adds ``"factors"``
        (whether the chosen fit uses them) and ``"val_auc_without_factors"``.

    """
    held_out = Rows.from_batches(val, max_rows, "the wide term's validation rows")
    # The dense columns and, where the term has them, the ids' count features and the
    # co-occurrence factors.
    columns = wide.linear_columns(train.sparse, train.dense)
    held_out_columns = wide.linear_columns(held_out.sparse, held_out.dense)
    # With factors, the grid is tried with them and without (their columns zeroed, which
    # leaves their weights at zero): a pair of fields whose co-occurrence says nothing
    # about clicks is then left out on validation, not fitted to the labeled rows' noise.
    # Without them first: on a tie the simpler fit is kept.
    variants = {True: (columns, held_out_columns)}
    if wide.factors is not None:
        keep = torch.ones(columns.shape[1])
        keep[-wide.factors.width :] = 0
        variants = {False: (columns * keep, held_out_columns * keep), **variants}
    fits, aucs = {}, {}
    for with_factors, (fit_columns, val_columns) in variants.items():
        for c in inverse_strengths:
            fit = fit_logistic(train.sparse, fit_columns, train.label, cardinalities, c)
            fits[with_factors, c] = fit
            aucs[with_factors, c] = binary_auc(
                fit.logits(held_out.sparse, val_columns), held_out.label
            )
    best = max(aucs, key=aucs.__getitem__)
    _load(fits[best], wide, output)
    report: dict[str, Any] = {
        "inverse_strength": fits[best].inverse_strength,
        "val_auc": {f"{c:g}": a for (with_factors, c), a in aucs.items() if with_factors},
        "rows": len(train),
    }
    if wide.factors is not None:
        report["factors"] = best[0]
        report["val_auc_without_factors"] = {
            f"{c:g}": a for (with_factors, c), a in aucs.items() if not with_factors
        }
    return report


def count_wide_ids(module: pl.LightningModule, wide: WideTerm) -> None:
    """Set ``wide``'s id count features and co-occurrence factors from the data module.

    Each is set unless the term lacks it or it is already set: counts and factors loaded
    with the weights (a resumed fit, a trained model) are kept.

    Raises:
        ValueError: no data module, or one that cannot count its ids.

    """
    needs = {method: features
             for method, features in (("id_counts", wide.counts), ("id_pair_counts", wide.factors))
             if features is not None and not features.fitted}  # fmt: skip
    if not needs:
        return
    data = module.trainer.datamodule
    missing = [method for method in needs if data is None or not hasattr(data, method)]
    if missing:
        raise ValueError(
            "CTRModule.wide_counts / wide_factors: counting the training rows' ids needs a "
            f"data module with {'() and '.join(missing)}() (got {type(data).__name__})"
        )
    if "id_counts" in needs:
        wide.counts.set_counts(data.id_counts())
    if "id_pair_counts" in needs:
        wide.factors.set_counts(*data.id_pair_counts(wide.factors.fields))


def wide_auto_start_reason(rows: int, ids: int) -> str | None:
    """Why ``wide_init="auto"`` trains the wide term from zero, or ``None``: it fits it first.

    Args:
        rows: labeled training rows of the fit.
        ids: ids of every field together (the sum of the cardinalities).

    Returns:
        ``None`` where the fields hold at most :data:`WIDE_AUTO_MAX_IDS` ids (the fit's
        memory grows with them) and there are at most :data:`WIDE_AUTO_MAX_ROWS` rows or at
        most :data:`WIDE_AUTO_ROWS_PER_ID` rows per id; otherwise the reason, for the log.

    """
    if ids > WIDE_AUTO_MAX_IDS:
        return f"{ids:,} ids, more than the {WIDE_AUTO_MAX_IDS:,} a regression start fits"
    if rows <= WIDE_AUTO_MAX_ROWS or rows <= WIDE_AUTO_ROWS_PER_ID * ids:
        return None
    return (f"{rows:,} labeled rows, more than {WIDE_AUTO_MAX_ROWS:,} and than "
            f"{WIDE_AUTO_ROWS_PER_ID} per id of the fields' {ids:,} ids")  # fmt: skip


def _auto_start(
    batches: Iterable[Batch], cardinalities: Sequence[int]
) -> tuple[str | None, Rows | None]:
    """:func:`wide_auto_start_reason` for a loader's labeled rows, and the rows it read.

    A loader that says how many rows it holds (``num_rows``) is not read here. Another is
    read up to :data:`WIDE_AUTO_MAX_ROWS` + 1 rows: more than the limit start from zero (the
    per-id rule needs the count), fewer are returned for the fit to use.
    """
    labeled = getattr(batches, "num_rows", None)
    if labeled is not None:
        return wide_auto_start_reason(int(labeled), sum(cardinalities)), None
    rows = Rows.from_batches(batches, WIDE_AUTO_MAX_ROWS + 1, "the wide term's training rows")
    if len(rows) > WIDE_AUTO_MAX_ROWS:
        return f"more than {WIDE_AUTO_MAX_ROWS:,} labeled rows", None
    return wide_auto_start_reason(len(rows), sum(cardinalities)), rows


def start_wide_term(
    module: pl.LightningModule, wide: WideTerm, state: torch.Tensor, mode: str
) -> None:
    """At a fit's start, fit ``wide`` first (``logistic``, or ``auto`` on few rows), once.

    ``state`` (the module's ``WideFitState`` buffer) records the decision, so a resumed fit
    holds a fitted term again and never refits it. ``module`` is a CTR module with a click
    ``head`` and a ``schema``, attached to a trainer with a data module.

    Raises:
        ValueError: ``logistic`` in more than one process (``auto`` trains from zero
            there), or no data module to read rows from.

    """
    if int(state) == WideFitState.fitted:
        hold_wide_term(wide)
    if int(state) != WideFitState.pending:
        return
    trainer = module.trainer
    if trainer.world_size > 1:
        if mode == "auto":
            state.fill_(WideFitState.trained)
            rank_zero_info("wide term: trained from zero (wide_init auto: more than one process)")
            return
        raise ValueError("CTRModule.wide_init='logistic' fits the wide term in one process")
    data = trainer.datamodule
    if data is None:
        raise ValueError(f"CTRModule.wide_init={mode!r} needs a data module (data: ...)")
    # The labeled rows alone where the data module can give them (a semi-supervised loader
    # would gather its unlabeled pool for nothing); otherwise its NaN-labeled rows are skipped.
    batches = getattr(data, "labeled_train_dataloader", data.train_dataloader)()
    rows = None
    if mode == "auto":
        reason, rows = _auto_start(batches, module.schema.cardinalities)
        if reason is not None:
            state.fill_(WideFitState.trained)
            rank_zero_info(f"wide term: trained from zero (wide_init auto: {reason})")
            return
    if rows is None:
        rows = Rows.from_batches(batches, WIDE_FIT_ROWS, "the wide term's training rows")
    report = prefit_wide(
        wide, module.head.output, module.schema.cardinalities, rows, data.val_dataloader()
    )
    hold_wide_term(wide)
    state.fill_(WideFitState.fitted)
    module.provenance["wide_fit"] = report
    best_auc = max(
        [*report["val_auc"].values(), *report.get("val_auc_without_factors", {}).values()]
    )
    factors = {True: ", with co-occurrence factors", False: ", without co-occurrence factors"}
    rank_zero_info(
        f"wide term: logistic regression on {report['rows']:,} labeled rows, held; "
        f"C={report['inverse_strength']:g}{factors.get(report.get('factors'), '')} "
        f"(validation AUC {best_auc:.4f})"
    )
