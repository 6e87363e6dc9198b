"""``ssl-rec plan``: the sharding plan of a config's tables over N ranks, printed and as JSON.

    ssl-rec plan --config configs/dist/synthetic_int8_row_wise.yaml --world_size 8
    ssl-rec plan --config CFG --world_size 8 --cardinalities criteo_kaggle --out plan.json

The model is built from the config (its data module gives the cardinalities; further
``--data.init_args...`` style flags are passed on); the sharding, overrides and plan file of
a ``ShardedTablesStrategy`` in the config apply. ``--cardinalities criteo_kaggle`` plans the
same tables at Criteo-Kaggle sizes. ``--stats_batches K`` measures the caches' hit rates on
K training batches first (a data pass), otherwise they are assumed uniform.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from ssl_rec._io import atomic_write_json
from ssl_rec.data import CRITEO_KAGGLE_CARDINALITIES
from ssl_rec.distributed.cost_model import TableInfo, default_hit_rate
from ssl_rec.distributed.planner import PlanResult, plan_tables, read_plan_file, tables_of
from ssl_rec.hardware.collection import MixedPrecisionEmbeddingCollection

__all__ = ["plan_main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ssl-rec plan", description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", required=True, help="fit config (repeatable)")
    parser.add_argument("--world_size", type=int, required=True, help="ranks to plan for")
    parser.add_argument("--local_world_size", type=int, default=None, help="ranks per host")
    parser.add_argument("--cardinalities", choices=["config", "criteo_kaggle"], default="config")
    parser.add_argument("--stats_batches", type=int, default=0, help="data pass for hit rates")
    parser.add_argument("--out", default="plan.json", help="JSON output path")
    return parser


def _data_pass(model: Any, datamodule: Any, collection, batches: int) -> None:
    """Run ``batches`` training batches through the tables' caches (no update) for hit rates."""
    datamodule.prepare_data()
    datamodule.setup("fit")
    collection.train()
    for i, batch in enumerate(datamodule.train_dataloader()):
        if i >= batches:
            break
        collection.group.admit_and_lookup(batch.sparse.to(collection.group.step.device))


def _strategy_settings(trainer: Any) -> tuple[str, dict]:
    from ssl_rec.lightning.strategy import ShardedTablesStrategy

    strategy = trainer.strategy
    if not isinstance(strategy, ShardedTablesStrategy):
        return "auto", {}
    overrides = read_plan_file(strategy.plan_file) if strategy.plan_file else {}
    overrides.update(strategy.table_overrides)
    return ("table_wise" if strategy.plan_file else strategy.sharding), overrides


def plan_main(argv: Sequence[str]) -> PlanResult:
    """Entry of ``ssl-rec plan``; returns the plan (also printed and written to ``--out``)."""
    from ssl_rec.cli.main import instantiate

    args, rest = _parser().parse_known_args(list(argv))
    if args.world_size < 1:
        raise ValueError(f"--world_size must be >= 1, got {args.world_size}")
    configs = [item for path in args.config for item in ("--config", path)]
    cli = instantiate([*configs, *rest])
    found = [m for m in cli.model.modules() if type(m) is MixedPrecisionEmbeddingCollection]
    if len(found) != 1:
        raise ValueError(
            f"{args.config}: the model holds {len(found)} embedding collections, not 1"
        )
    collection = found[0]
    if args.stats_batches:
        _data_pass(cli.model, cli.datamodule, collection, args.stats_batches)
    tables = tables_of(collection)
    if args.cardinalities == "criteo_kaggle":
        if len(tables) != len(CRITEO_KAGGLE_CARDINALITIES):
            raise ValueError(
                f"--cardinalities criteo_kaggle needs 26 tables, the model has {len(tables)}"
            )
        tables = [TableInfo(t.name, rows, t.dim, t.spec, default_hit_rate(t.spec))
                  for t, rows in zip(tables, CRITEO_KAGGLE_CARDINALITIES, strict=True)]  # fmt: skip
    sharding, overrides = _strategy_settings(cli.trainer)
    result = plan_tables(tables, args.world_size, args.local_world_size, sharding, overrides)
    print(result.format())
    atomic_write_json(args.out, result.to_dict())
    print(f"wrote {args.out}")
    return result
