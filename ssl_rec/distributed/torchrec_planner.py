"""TorchRec's ``EmbeddingShardingPlanner`` over the library's tables (imports TorchRec).

The planner walks a model for modules its sharders know and asks them for shapes. A
:class:`PlanningStub` stands in for the collection (names, rows and D only, nothing
allocated); the estimators replace TorchRec's storage and perf models, which know FBGEMM's
kernels, with the library's byte counts and measured kernel rates.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from torch import nn
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.proposers import GreedyProposer, UniformProposer
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import (
    ParameterConstraints,
    Perf,
    PlannerError,
    ShardEstimator,
    ShardingOption,
    Storage,
)

from ssl_rec.distributed.cost_model import (
    KernelRates,
    Network,
    TableInfo,
    replica_chain_hops,
    replica_grad_bytes,
    replica_seconds,
    shard_bytes,
    shard_seconds,
)
from ssl_rec.distributed.exact_shardings import allowed_types, column_shards
from ssl_rec.distributed.sharder import MixedPrecisionCollectionSharder
from ssl_rec.distributed.table_placement import (
    COLUMN_WISE,
    DATA_PARALLEL,
    TABLE_WISE,
    TablePlacement,
)

__all__ = ["PlanningStub", "torchrec_plan"]

_PATH = "tables"
BANDWIDTH = Network().bandwidth_gb_s * 1e9  # bytes/s per rank, the cost model's default


class PlanningStub(nn.Module):
    """Shapes of a collection's tables, for the planner (no storage)."""

    def __init__(self, tables: Sequence[TableInfo]) -> None:
        super().__init__()
        self.table_names = [t.name for t in tables]
        self.cardinalities = [t.rows for t in tables]
        self.embedding_dim = tables[0].dim


class _StubSharder(MixedPrecisionCollectionSharder):
    @property
    def module_type(self) -> type[PlanningStub]:
        return PlanningStub


class _LibraryEstimator(ShardEstimator):
    """Shard storage from ``hardware.memory``, shard perf from the measured kernel rates.

    Bytes are counted as HBM: TorchRec's memory-balancing paths look at HBM whatever the
    device label, and the library's tables are one memory tier.
    """

    def __init__(self, tables: Sequence[TableInfo], rates: KernelRates, batch: int) -> None:
        self._tables = {t.name: t for t in tables}
        self._rates, self._batch = rates, batch

    def estimate(self, sharding_options: list[ShardingOption], sharder_data_map=None) -> None:
        for option in sharding_options:
            table, world_batch = self._tables[option.name], self._batch
            if option.sharding_type == DATA_PARALLEL:
                _price_replicas(option, table, world_batch, self._rates)
                continue
            n = len(option.shards)
            compute = shard_seconds(table, n, world_batch, self._rates)
            comms = world_batch / n * table.dim * 4 / BANDWIDTH
            for j, shard in enumerate(option.shards):
                shard.storage = Storage(hbm=shard_bytes(table, n, j), ddr=0)
                shard.perf = Perf(fwd_compute=compute / 3, fwd_comms=comms,
                                  bwd_compute=2 * compute / 3, bwd_comms=comms)  # fmt: skip


def _price_replicas(
    option: ShardingOption, table: TableInfo, world_batch: int, rates: KernelRates
) -> None:
    """One whole replica per rank, as ``ssl_rec.distributed.replica_grads`` trains them.

    Every replica receives the global batch's ids, dedupes and admits them, looks up its
    local batch and updates the batch's unique rows (:func:`replica_seconds`); no rows
    travel; backward passes the ``[U, D]`` gradient sums along the ranks and broadcasts them
    (:func:`replica_chain_hops` messages; their bandwidth term here: the chain's latency is
    shared by every replica of the plan).
    """
    world = len(option.shards)
    local = world_batch // world
    compute = replica_seconds(table, world, local, rates)
    ids = world_batch * (world - 1) / world * 12 / BANDWIDTH  # int64 id + int32 length
    reduce = replica_chain_hops(world) * replica_grad_bytes(table, world_batch) / BANDWIDTH
    replica = shard_bytes(table, 1, 0)
    for shard in option.shards:
        shard.storage = Storage(hbm=replica, ddr=0)
        shard.perf = Perf(fwd_compute=compute / 3, fwd_comms=ids,
                          bwd_compute=2 * compute / 3, bwd_comms=reduce)  # fmt: skip


class _NoReplicaSpecWarning(logging.Filter):
    """TorchRec warns that a ``data_parallel`` table has no sharding spec: replicas have none."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Sharding spec not found for")


def _constraints(table: TableInfo, world_size: int, local: int) -> ParameterConstraints:
    """The table's exact shardings; a column-wise split into :func:`column_shards` shards."""
    types = allowed_types(table, world_size, local)
    n = column_shards(table, world_size) if COLUMN_WISE in types else 0
    # TorchRec cuts D into shards of min_partition columns (block b of n on shard b % n
    # here, columns b * D / n there: the same bytes and work per shard).
    return ParameterConstraints(sharding_types=types, min_partition=table.dim // n if n else None)


def _placement(table: TableInfo, sharding_type: str, ranks: list[int]) -> TablePlacement:
    """The library's placement of TorchRec's choice for ``table``.

    TorchRec's partitioner may put several column shards of a table on one rank; the
    library's column-wise split needs distinct ranks, so such a table goes whole to the
    rank holding most of its shards (the same bytes there, less on the others).
    """
    if sharding_type != COLUMN_WISE or len(set(ranks)) == len(ranks):
        return TablePlacement(sharding_type, tuple(ranks))
    busiest = max(sorted(set(ranks)), key=ranks.count)
    return TablePlacement(TABLE_WISE, (busiest,))


def _plan_once(tables, world_size, local, rates, batch, capacity) -> dict[str, TablePlacement]:
    topology = Topology(world_size=world_size, compute_device="cuda", hbm_cap=capacity,
                        ddr_cap=0, local_world_size=local)  # fmt: skip
    constraints = {t.name: _constraints(t, world_size, local) for t in tables}
    estimator = _LibraryEstimator(tables, rates, batch * world_size)
    planner = EmbeddingShardingPlanner(
        topology=topology,
        batch_size=batch,
        enumerator=EmbeddingEnumerator(topology, batch, constraints, estimator=[estimator]),
        storage_reservation=FixedPercentageStorageReservation(0.0),
        proposer=[GreedyProposer(), GreedyProposer(use_depth=False), UniformProposer()],
        partitioner=GreedyPerfPartitioner(),
        constraints=constraints,
        debug=False,
    )
    root = nn.Module()
    root.add_module(_PATH, PlanningStub(tables))
    quiet = _NoReplicaSpecWarning()
    logging.getLogger().addFilter(quiet)
    try:
        module_plan = planner.plan(root, [_StubSharder()]).get_plan_for_module(_PATH)
    finally:
        logging.getLogger().removeFilter(quiet)
    return {t.name: _placement(t, module_plan[t.name].sharding_type,
                               list(module_plan[t.name].ranks)) for t in tables}  # fmt: skip


def torchrec_plan(
    tables: Sequence[TableInfo],
    world_size: int,
    local_world_size: int,
    rates: KernelRates,
    slack: Sequence[float],
    batch: int,
) -> dict[str, TablePlacement]:
    """TorchRec's plan under the per-rank capacity ``(1 + s) * total / W``, first ``s`` that fits.

    Memory balance comes first (the capacity), then the slowest rank's time (the partitioner).

    Raises:
        ValueError: no capacity in ``slack`` fits (a table larger than every rank's share
            that cannot be split exactly).

    """
    total = sum(shard_bytes(t, 1, 0) for t in tables)
    largest = max(shard_bytes(t, 1, 0) for t in tables)
    for s in slack:
        capacity = int((1 + s) * total / world_size) + 1
        try:
            return _plan_once(tables, world_size, local_world_size, rates, batch, capacity)
        except PlannerError:
            continue
    raise ValueError(
        f"no plan of {len(tables)} tables ({total / 2**20:.1f} MiB, largest {largest / 2**20:.1f} "
        f"MiB) within {1 + slack[-1]:.0f}x the per-rank share on {world_size} ranks; split the "
        "largest tables (more cache rows make their sets divisible) or set them by hand"
    )
