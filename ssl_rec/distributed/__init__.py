"""Scale-out: the library's low-precision cached tables sharded on TorchRec's comm layer.

The single-machine path never imports TorchRec: this package's top level holds only plain
plans, the planner and the cost model; the TorchRec modules (``sharder``,
``sharded_collection``) are imported where they are used.
"""

from ssl_rec.distributed.table_placement import (
    DATA_PARALLEL,
    ROW_WISE,
    SHARDING_TYPES,
    TABLE_ROW_WISE,
    TABLE_WISE,
    TablePlacement,
    check_plan,
    plan_from_dict,
    plan_to_dict,
    uniform_plan,
)

__all__ = [
    "DATA_PARALLEL",
    "ROW_WISE",
    "SHARDING_TYPES",
    "TABLE_ROW_WISE",
    "TABLE_WISE",
    "TablePlacement",
    "check_plan",
    "plan_from_dict",
    "plan_to_dict",
    "uniform_plan",
]
