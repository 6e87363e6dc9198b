"""A simulated cost model of sharded training: memory, all-to-all bytes and step time per rank.

For sizing a cluster before having one. Assumptions (see docs/scale-out.md):

- Every sample holds one id per table. A table's shard on ``n`` ranks serves ``B_global / n``
  ids per step (cyclic rows spread ids evenly whatever their skew); a column-wise shard gets
  every id and serves ``1 / n`` of its values, priced the same.
- A replica (``data_parallel``) on each rank dedupes the global batch's ids, admits their
  ``U`` unique rows (``U`` as for uniform ids, at most the rows and ``B_global``), gathers
  its local batch's rows and updates the ``U`` rows; its ``[U, D]`` FP32 gradient sums go
  along the ranks (``W - 1`` hops) and back by a binomial-tree broadcast (``ceil(log2 W)``
  hops), one message per hop for all replicas (their latency once for all).
- Kernel time per id comes from measured rates (:class:`KernelRates`, one CPU thread):
  a cache hit costs what an FP32 row costs, a miss what the storage precision costs; a
  training step is one forward (admission + lookup) and one backward (fused update).
- Ids travel as int64 values plus int32 lengths (one per sample and key; a row-split table
  has a key per shard); rows and their gradients as ``comm_bytes`` per value (4 for FP32,
  2 for FP16, ~1 for INT8) once each way.
- Collectives run back to back, not overlapped with compute: an all-to-all costs
  ``latency * (W - 1) + max over ranks of max(sent, received) / bandwidth``; the dense
  gradient all-reduce is a ring, ``2 (W - 1) (latency + bytes / (W * bandwidth))``.
- The step time is the slowest rank's kernel time plus the collectives plus the dense
  layers' forward and backward on the local batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from ssl_rec.distributed.cyclic_layout import shard_rows
from ssl_rec.distributed.table_placement import TablePlacement
from ssl_rec.hardware.cache import cache_geometry
from ssl_rec.hardware.memory import table_memory
from ssl_rec.hardware.spec import TableSpec

__all__ = [
    "KernelRates",
    "Network",
    "TableInfo",
    "replica_chain_hops",
    "replica_grad_bytes",
    "replica_seconds",
    "ring_allreduce_seconds",
    "shard_bytes",
    "shard_seconds",
    "step_cost",
    "unique_rows",
]


@dataclass(frozen=True)
class TableInfo:
    """What the planner and the cost model know of a table.

    Args:
        name: Table name.
        rows: Rows R.
        dim: Embedding dimension D.
        spec: Storage, cache and optimizer.
        hit_rate: Fraction of lookups served by the FP32 cache (0 without cache), from the
            cache's counters, a data pass, or :func:`default_hit_rate`.

    """

    name: str
    rows: int
    dim: int
    spec: TableSpec
    hit_rate: float = 0.0


def default_hit_rate(spec: TableSpec) -> float:
    """Hit rate assumed without access statistics: the cached fraction (uniform access)."""
    return spec.cache_fraction if spec.cached else 0.0


@dataclass(frozen=True)
class KernelRates:
    """Measured kernel costs on one CPU thread (``benchmarks/scale_out.py``).

    Args:
        forward_ns: Training forward (admission + lookup) ns per id, by storage precision.
        backward_ns: Fused update ns per id, by storage precision.
        call_us: Fixed cost of one kernel call and its bookkeeping, microseconds.
        dense_ns_per_sample: Dense layers' forward + backward ns per sample.
        dedup_ns: Admission's deduplication ns per id of a table with few rows (a replica
            dedupes the global batch's ids).

    """

    forward_ns: Mapping[str, float] = field(default_factory=lambda: dict(_FORWARD_NS))
    backward_ns: Mapping[str, float] = field(default_factory=lambda: dict(_BACKWARD_NS))
    call_us: float = 20.0
    dense_ns_per_sample: float = 57200.0
    # admit() of 32768 ids of a 4- and a 1500-row table, compiled kernels, one thread, on
    # the development VM: 3.5-5.2 ns per id
    dedup_ns: float = 5.0

    def to_dict(self) -> dict:
        """JSON form."""
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in asdict(self).items()}


# Defaults: benchmarks/scale_out.py on the 2-core development VM under load (its JSON's
# "rates"; D = 16, no cache, one thread; bf16 priced as fp16, int2 as int4). Re-measure with
# the benchmark on the target hardware and pass KernelRates(...).
_FORWARD_NS = {"fp32": 29.0, "fp16": 27.0, "bf16": 27.0, "int8": 156.0, "int4": 171.0,
               "int2": 171.0}  # fmt: skip
_BACKWARD_NS = {"fp32": 250.0, "fp16": 1208.0, "bf16": 1208.0, "int8": 284.0, "int4": 499.0,
                "int2": 499.0}  # fmt: skip


@dataclass(frozen=True)
class Network:
    """Interconnect assumptions.

    Args:
        bandwidth_gb_s: Per-rank injection bandwidth, GB/s (12.5 = 100 Gb/s).
        latency_us: Per-message latency, microseconds.
        comm_bytes: Bytes per embedding value on the wire (4 FP32, 2 FP16, 1.125 INT8).

    """

    bandwidth_gb_s: float = 12.5
    latency_us: float = 10.0
    comm_bytes: float = 4.0


def shard_bytes(table: TableInfo, n: int, j: int) -> int:
    """Bytes of shard ``j`` of ``n`` of ``table``: store, cache, metadata and optimizer state.

    Of its stored rows (``R * k`` of ``D / k`` with ``k`` column blocks): a row-wise shard
    or a column-wise one, whose blocks are the stored rows' cyclic split.
    """
    rows, dim = table.spec.stored_shape(table.rows, table.dim, f"table {table.name!r}")
    sets = cache_geometry(rows, table.spec)
    report = table_memory(shard_rows(rows, n, j), dim, table.spec,
                          sets=sets // n if n > 1 else None)  # fmt: skip
    return report["total_bytes"] + report["optimizer_state"]


def shard_seconds(table: TableInfo, n: int, global_batch: int, rates: KernelRates) -> float:
    """Kernel seconds per training step of one of ``n`` shards of ``table``.

    A row-wise shard serves ``1 / n`` of the ids, a column-wise one ``1 / n`` of every
    id's values: both are priced as ``B_global / n`` ids.
    """
    forward, backward = _per_id_ns(table, rates)
    return global_batch / n * (forward + backward) * 1e-9 + 2 * rates.call_us * 1e-6


def _per_id_ns(table: TableInfo, rates: KernelRates) -> tuple[float, float]:
    """(forward, backward) ns per id of ``table``, cache hits at FP32 rates."""
    precision = table.spec.precision.value
    hit = table.hit_rate if table.spec.cached else 0.0
    forward = hit * rates.forward_ns["fp32"] + (1 - hit) * rates.forward_ns[precision]
    backward = hit * rates.backward_ns["fp32"] + (1 - hit) * rates.backward_ns[precision]
    return forward, backward


def unique_rows(rows: int, ids: int) -> float:
    """Expected distinct rows among ``ids`` uniform draws of ``rows`` rows.

    ``R (1 - (1 - 1 / R)^N)``: at most ``min(R, N)``; skewed ids give fewer.
    """
    if rows <= 1 or ids <= 0:
        return float(min(rows, ids))
    return rows * -math.expm1(ids * math.log1p(-1.0 / rows))


def replica_seconds(
    table: TableInfo, world_size: int, batch_per_rank: int, rates: KernelRates
) -> float:
    """Kernel seconds per training step of one replica of ``table`` (the same on every rank).

    Dedup of the global batch's ``W * B`` ids, admission of their ``U`` unique rows
    (:func:`unique_rows`), the lookup of the rank's ``B`` samples and the update of the
    ``U`` rows (the rank's per-row gradient sum before the all-reduce is not priced).
    """
    forward, backward = _per_id_ns(table, rates)
    global_batch = world_size * batch_per_rank
    u = unique_rows(table.rows, global_batch)
    ns = global_batch * rates.dedup_ns + (batch_per_rank + u) * forward + u * backward
    return ns * 1e-9 + 3 * rates.call_us * 1e-6


def replica_grad_bytes(table: TableInfo, global_batch: int) -> float:
    """Bytes of a replica's ``[U, D]`` FP32 gradient sums, in each message of a step's chain."""
    return unique_rows(table.rows, global_batch) * table.dim * 4


def replica_chain_hops(world_size: int) -> int:
    """Messages in a row of the replicas' gradient chain: ``W - 1`` + ``ceil(log2 W)``.

    The sums go from rank to rank in order (each rank adds its samples, so the sum keeps
    the global sample order: ``ssl_rec.distributed.replica_grads``), then the last rank
    broadcasts them (a binomial tree, as gloo's). Each hop carries the whole ``[U, D]``.
    """
    if world_size <= 1:
        return 0
    return world_size - 1 + math.ceil(math.log2(world_size))


def ring_allreduce_seconds(nbytes: float, world_size: int, network: Network) -> float:
    """A ring all-reduce of ``nbytes``: ``2 (W - 1) (latency + bytes / (W * bandwidth))``."""
    if world_size <= 1:
        return 0.0
    bandwidth = network.bandwidth_gb_s * 1e9
    return 2 * (world_size - 1) * (network.latency_us * 1e-6 + nbytes / (world_size * bandwidth))


def _a2a_seconds(sent: Sequence[float], received: Sequence[float], network: Network) -> float:
    world = len(sent)
    if world <= 1:
        return 0.0
    volume = max(max(s, r) for s, r in zip(sent, received, strict=True))
    return network.latency_us * 1e-6 * (world - 1) + volume / (network.bandwidth_gb_s * 1e9)


def step_cost(
    tables: Sequence[TableInfo],
    placements: Mapping[str, TablePlacement],
    world_size: int,
    batch_per_rank: int,
    dense_param_bytes: int,
    rates: KernelRates | None = None,
    network: Network | None = None,
) -> dict:
    """Predicted per-rank memory, bytes on the wire and step time of one training step.

    Returns:
        ``{"per_rank_bytes", "per_rank_kernel_s", "a2a_bytes_per_rank" (max over ranks of the
        all-to-all bytes of a step: ids in and out, rows forward and gradients backward),
        "replica_grad_bytes" (the replicas' ``[U, D]`` gradient sums, each message of the
        chain of :func:`replica_chain_hops` hops),
        "step_s", "parts"}``.

    """
    rates, network = rates or KernelRates(), network or Network()
    global_batch, world = batch_per_rank * world_size, world_size
    memory, kernel = [0] * world, [0.0] * world
    rows_out, ids_in = [0.0] * world, [0.0] * world
    ids_out = [0.0] * world
    rows_in = [0.0] * world
    replica_bytes = 0.0
    for table in tables:
        placement = placements[table.name]
        ranks, n, column = placement.ranks, placement.row_splits, placement.column_split
        row_bytes = table.dim * network.comm_bytes
        replicated = placement.replicated
        if replicated:  # its rows stay on the rank; its gradient sums go in the chain
            replica_bytes += replica_grad_bytes(table, global_batch)
        for j, rank in enumerate(ranks):
            memory[rank] += shard_bytes(table, n, j if n > 1 else 0)
            kernel[rank] += (replica_seconds(table, world, batch_per_rank, rates) if replicated
                             else shard_seconds(table, n, global_batch, rates))  # fmt: skip
            # a column-wise shard gets every id
            ids_in[rank] += global_batch / (1 if column else n) * 8 + global_batch * 4
            rows_out[rank] += 0.0 if replicated else global_batch / n * row_bytes
        # a replicated table's ids go to every rank, one key each
        keys = world if replicated else n
        for rank in range(world):
            ids_out[rank] += batch_per_rank * (8 * (keys if column else keys // n) + 4 * keys)
            rows_in[rank] += 0.0 if replicated else batch_per_rank * row_bytes
    ring = ring_allreduce_seconds(dense_param_bytes, world, network)
    parts = {
        "kernels_s": max(kernel),
        "ids_a2a_s": _a2a_seconds(ids_out, ids_in, network),
        "rows_a2a_s": 2 * _a2a_seconds(rows_out, rows_in, network),  # forward and backward
        "dense_s": batch_per_rank * rates.dense_ns_per_sample * 1e-9,
        "allreduce_s": ring,
        "replica_chain_s": replica_chain_hops(world)
        * (network.latency_us * 1e-6 + replica_bytes / (network.bandwidth_gb_s * 1e9))
        if replica_bytes
        else 0.0,
    }
    a2a = max(
        i + o + 2 * max(r, q) for i, o, r, q in zip(ids_out, ids_in, rows_out, rows_in, strict=True)
    )
    return {"per_rank_bytes": memory, "per_rank_kernel_s": kernel, "a2a_bytes_per_rank": a2a,
            "replica_grad_bytes": replica_bytes, "step_s": sum(parts.values()),
            "parts": parts}  # fmt: skip
