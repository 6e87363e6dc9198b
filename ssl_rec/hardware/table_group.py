"""``TableGroup``: tables looked up by one fused kernel call, the optimizer fused into backward.

As in FBGEMM's table-batched embeddings (TBE):

A training forward runs ``admit`` (each table's ids deduplicated once, the unique rows
looked up in the cache, misses admitted with eviction write-back) and ``gather`` (each
sample's value) over all tables in one call each. The autograd Function takes a 0-element
placeholder that requires grad, as FBGEMM does, so autograd calls its backward; backward
runs ``update`` on the forward's plan (per-row gradient sum, optimizer step, FP32 cache write
or stochastically rounded store write) and returns no gradient: no dense gradient of a
table is ever materialised. ``prefetch`` admits the next batch ahead, on a helper thread,
while the current batch's dense layers run (see ``prefetch.py``). Tables with column blocks
are looked up by one call per block width (``column_blocks.py``); a batch's plan is then one
``AdmittedBatch`` per call.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

import torch
from torch import nn

from ssl_rec.hardware import buffer_epoch
from ssl_rec.hardware.column_blocks import block_calls, expand_ids, merge_blocks, split_blocks
from ssl_rec.hardware.kernels.compiled import CompiledKernels
from ssl_rec.hardware.kernels.dispatch import get_kernels, require_training_kernels
from ssl_rec.hardware.kernels.table_meta import AdmittedBatch, TableTensors
from ssl_rec.hardware.memory import summarize
from ssl_rec.hardware.precision import Precision
from ssl_rec.hardware.prefetch import AdmissionQueue
from ssl_rec.hardware.table import EmbeddingTable

__all__ = ["TableGroup", "check_table_ids"]


def _check_shape(ids: torch.Tensor, limits: torch.Tensor) -> None:
    if ids.dim() != 2 or ids.shape[1] != limits.shape[0]:
        raise ValueError(f"ids shape {tuple(ids.shape)} must be [B, {limits.shape[0]}]")


def check_table_ids(ids: torch.Tensor, limits: torch.Tensor) -> None:
    """Raise for ids that are not ``int64[B, T]`` within ``[0, limits[t])``.

    Args:
        ids: int64[B, T] ids.
        limits: int64[T] cardinalities.

    Raises:
        ValueError: ids not ``[B, T]``.
        IndexError: naming the table, the id, the cardinality and the sample of a bad id.

    """
    _check_shape(ids, limits)
    if ids.numel() == 0:
        return
    # One pass for every column's extremes; the element-wise search only on failure.
    low, high = torch.aminmax(ids, dim=0)
    if bool((low < 0).any()) or bool((high >= limits).any()):
        bad = (ids < 0) | (ids >= limits)
        b, f = (int(v) for v in bad.nonzero()[0])
        raise IndexError(
            f"table {f}: id {int(ids[b, f])} out of range [0, {int(limits[f])}) "
            f"(cardinality {int(limits[f])}) at sample {b}"
        )


def _wait_hook(module: TableGroup, *args: object) -> None:
    module.wait()


class _FusedLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, placeholder, group, plan):  # noqa: D102
        ctx.group, ctx.plan = group, plan
        return group.gather(plan)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        ctx.group.apply_update(ctx.plan, grad)
        return None, None, None


class TableGroup(nn.Module):
    """Tables sharing one kernel call, one RNG seed and one step counter.

    Args:
        tables: The tables, all of one logical dimension D (stored ``D / k`` wide with ``k``
            column blocks).
        seed: Seed of the stochastic-rounding RNG.

    Attributes:
        step: int64 scalar buffer, the RNG step counter (saved in ``state_dict``).

    Example:
        >>> from ssl_rec.hardware.spec import TableSpec
        >>> g = TableGroup([EmbeddingTable(10, 4, TableSpec("int8"), stream=0)], seed=0)
        >>> g.tables[0].init_normal(0.05, 0)
        >>> g(torch.tensor([[1], [2]]), train=False).shape
        torch.Size([2, 1, 4])

    """

    def __init__(self, tables: list[EmbeddingTable], seed: int) -> None:
        super().__init__()
        dims = {t.dim * t.spec.column_blocks for t in tables}
        if len(dims) != 1:
            raise ValueError(f"all tables of a group need one embedding_dim, got {sorted(dims)}")
        self.dim = dims.pop()
        per_id = [t.rows_per_id for t in tables]
        # None: one kernel call for all tables (no column blocks), the plain path.
        self._calls = block_calls(per_id) if max(per_id) > 1 else None
        self._per_id = per_id
        self.tables = nn.ModuleList(tables)
        self.seed = seed
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))
        self._meta = torch.tensor([t.meta_row() for t in tables], dtype=torch.int64)
        hp = [[t.spec.learning_rate, t.spec.eps, t.spec.weight_decay] for t in tables]
        self._hparams = torch.tensor(hp, dtype=torch.float32)
        limits = [t.num_rows // per for t, per in zip(tables, per_id, strict=True)]
        self._limits = torch.tensor(limits, dtype=torch.int64)
        self._low_precision = any(t.spec.precision is not Precision.fp32 for t in tables)
        self.queue = AdmissionQueue()
        self._scheduled: tuple[torch.Tensor, bool] | None = None
        self._kept_views: dict[int | None, tuple[tuple, TableTensors]] = {}
        # Saving or loading waits for an admission in flight (it writes these buffers).
        self.register_state_dict_pre_hook(_wait_hook)
        self._register_load_state_dict_pre_hook(_wait_hook, with_module=True)

    def __getstate__(self) -> dict:
        # The kept view holds a compiled handle, which neither pickles nor deep-copies.
        return {**super().__getstate__(), "_kept_views": {}}

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202 - nn.Module's signature
        self._kept_views = {}  # let the old tensors go before new ones are made
        return super()._apply(fn, recurse)

    def tensors(self, tables: list[int] | None = None) -> TableTensors:
        """The kernels' view of (a subset of) the tables.

        The view of all tables is kept, with the compiled kernels' validated handle, until a
        table's tensor or module is replaced (``buffer_epoch``) or the kernels change.
        """
        if tables is not None:
            return self._build_tensors(tables)
        return self._kernel_view(get_kernels())

    def _kernel_view(
        self, kernels: ModuleType | CompiledKernels, call: int | None = None
    ) -> TableTensors:
        """The kept view of all tables, or of the tables of column-block call ``call``."""
        key = (buffer_epoch.current(), kernels, tuple(self.tables._modules.values()))
        kept = self._kept_views.get(call)
        if kept is not None and kept[0] == key:
            return kept[1]
        t = self._build_tensors(None if call is None else self._calls[call][0])
        if isinstance(kernels, CompiledKernels):
            t = kernels.bind(t)
        self._kept_views[call] = (key, t)
        return t

    def _combine(self, outs: list[torch.Tensor], batch: int) -> torch.Tensor:
        """float32[B, T, D] from each call's float32[B * per, T_c, D / per] output."""
        out = torch.empty(batch, len(self._per_id), self.dim)
        for (tables, per), rows in zip(self._calls, outs, strict=True):
            out[:, tables] = merge_blocks(rows, per)
        return out

    def _build_tensors(self, tables: list[int] | None) -> TableTensors:
        # The buffer dicts, not module attributes: ``nn.Module.__getattr__`` costs about a
        # microsecond a lookup, and a kernel call needs six per table. ``Module._apply``
        # (``.to()``, ``.float()``) replaces entries of these same dicts, so they stay current.
        own = [(t._buffers, t._modules["cache"]._buffers) for t in self.tables._modules.values()]
        sel = own if tables is None else [own[i] for i in tables]
        meta, hparams = self._meta, self._hparams
        if tables is not None:
            meta, hparams = meta[tables], hparams[tables]
        return TableTensors(
            stores=[t["store"] for t, _ in sel],
            cache_rows=[c["rows"] for _, c in sel],
            cache_tags=[c["tags"] for _, c in sel],
            cache_state=[c["state"] for _, c in sel],
            stats=[c["stats"] for _, c in sel],
            momentum=[t["momentum"] for t, _ in sel],
            meta=meta,
            hparams=hparams,
        )

    def check_ids(self, ids: torch.Tensor, limits: torch.Tensor | None = None) -> None:
        """Raise for bad ids: :func:`check_table_ids` against ``limits`` (default: all tables')."""
        check_table_ids(ids, self._limits if limits is None else limits)

    def _next_step(self) -> int:
        step = int(self.step)
        self.step.add_(1)  # in place: no Module.__setattr__ per step
        return step

    def wait(self) -> None:
        """Wait for an admission running ahead on the helper thread (see :meth:`prefetch`)."""
        self.queue.wait()

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Current values (cache if cached, else store): float32[B, T, D], no side effects."""
        self.wait()
        kernels = get_kernels()
        if self._calls is None:
            return kernels.forward(self._kernel_view(kernels), ids)
        self.check_ids(ids)
        outs = [kernels.forward(self._kernel_view(kernels, c), expand_ids(ids[:, tables], per))
                for c, (tables, per) in enumerate(self._calls)]  # fmt: skip
        return self._combine(outs, ids.shape[0])

    def _training_kernels(self):
        if self._low_precision:
            return require_training_kernels("low-precision embedding tables")
        return get_kernels()

    def _admit_calls(
        self,
        kernels: ModuleType | CompiledKernels,
        ids: torch.Tensor,
        step: int,
        locks: list,
        parallel: bool,
    ) -> AdmittedBatch | tuple[AdmittedBatch, ...]:
        """The plan of ids int64[B, T]: one AdmittedBatch, or one per call with blocks."""
        if self._calls is None:
            return kernels.admit(self._kernel_view(kernels), ids, self.seed, step, locks,
                                 parallel)  # fmt: skip
        return tuple(
            kernels.admit(self._kernel_view(kernels, c), expand_ids(ids[:, tables], per),
                          self.seed, step, [lock[c] for lock in locks], parallel)
            for c, (tables, per) in enumerate(self._calls)
        )  # fmt: skip

    def admit(self, ids: torch.Tensor, parallel: bool = True) -> AdmittedBatch:
        """Admit ids int64[B, T] into the caches now: the :class:`AdmittedBatch` of the batch.

        Rows of plans still waiting for their backward stay cached (locked). With column
        blocks the plan is a tuple of one ``AdmittedBatch`` per kernel call.
        """
        self.wait()
        kernels = self._training_kernels()
        step = int(self.step)  # taken only once the kernels accept the batch
        if self._calls is not None:
            self.check_ids(ids)  # before any call changes a cache
        plan = self._admit_calls(kernels, ids, step, self.queue.pending, parallel)
        self.step.add_(1)  # in place: no Module.__setattr__ per step
        self.queue.add_pending(plan)
        return plan

    def prefetch(self, ids: torch.Tensor, background: bool = True) -> None:
        """Admit ids int64[B, T] now, ahead of their training forward.

        The forward that receives exactly these ids then only gathers. With ``background``
        the admission runs on a helper thread beside the caller; anything else that uses the
        tables waits for it first (a gather of a pending plan runs beside it: that plan's
        rows are locked), so results equal ``background=False``.
        """
        ids = self._prefetch_ids(ids)
        self.wait()
        kernels = self._training_kernels()
        step, locks = self._next_step(), list(self.queue.pending)
        if self._calls is None:
            self._kernel_view(kernels)  # built here, not on the helper thread
        else:
            for call in range(len(self._calls)):
                self._kernel_view(kernels, call)

        def admit() -> AdmittedBatch:
            return self._admit_calls(kernels, ids, step, locks, not background)

        self.queue.start(ids, admit, background)

    def schedule_prefetch(self, ids: torch.Tensor | None, background: bool = True) -> None:
        """Prefetch ids int64[B, T] right after the next training forward's own admission.

        The way a training loop overlaps the next batch's admission with the current
        batch's dense layers: call it before the current forward with the next batch's ids
        (``None`` cancels). See :meth:`prefetch`.
        """
        self._scheduled = None if ids is None else (self._prefetch_ids(ids), background)

    def _prefetch_ids(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.to(torch.int64).contiguous().clone()
        self.check_ids(ids)
        return ids

    def gather(self, plan: AdmittedBatch) -> torch.Tensor:
        """Values of a pending (admitted, not yet updated) plan: float32[B, T, D].

        Runs beside an admission in flight: it reads only the plan's locked slots and store
        rows no admission writes.
        """
        kernels = get_kernels()
        if self._calls is None:
            return kernels.gather(self._kernel_view(kernels), plan)
        outs = [kernels.gather(self._kernel_view(kernels, c), part) for c, part in enumerate(plan)]
        return self._combine(outs, plan[0].inverse.shape[1] // self._calls[0][1])

    def apply_update(self, plan: AdmittedBatch, grad: torch.Tensor) -> None:
        """Fused optimizer step for gradient float32[B, T, D] of the output of ``plan``."""
        self.wait()
        self.queue.done(plan)
        grad = grad.to(torch.float32).contiguous()
        kernels = get_kernels()
        if self._calls is None:
            kernels.update(self._kernel_view(kernels), plan, grad, self.seed, self._next_step())
            return
        step = self._next_step()
        for c, ((tables, per), part) in enumerate(zip(self._calls, plan, strict=True)):
            kernels.update(self._kernel_view(kernels, c), part, split_blocks(grad[:, tables], per),
                           self.seed, step)  # fmt: skip

    def forward(self, ids: torch.Tensor, train: bool) -> torch.Tensor:
        """Look up one id per (sample, table).

        Args:
            ids: int64[B, T] table-local ids.
            train: Admit rows into the caches and attach the fused-update backward.

        Returns:
            float32[B, T, D]; requires grad when ``train`` and grad mode is on.

        """
        ids = ids.to(torch.int64).contiguous()
        _check_shape(ids, self._limits)
        try:
            return self._forward(ids, train)
        except IndexError:
            self.check_ids(ids)  # the kernels' range check failed: name the cardinality too
            raise

    def _forward(self, ids: torch.Tensor, train: bool) -> torch.Tensor:
        # The kernels check every id (one vectorized pass), before they change anything.
        if not (train and torch.is_grad_enabled()):
            with torch.no_grad():
                return self.lookup(ids)
        plan = self.queue.take(ids)
        if plan is None:
            plan = self.admit(ids)
        if self._scheduled is not None:
            (next_ids, background), self._scheduled = self._scheduled, None
            self.prefetch(next_ids, background)
        placeholder = torch.empty(0, requires_grad=True)
        return _FusedLookup.apply(placeholder, self, plan)

    def set_learning_rate(self, learning_rate: float) -> None:
        """Step every table's fused optimizer with ``learning_rate`` from now on (> 0)."""
        if not learning_rate > 0:
            raise ValueError(f"learning_rate={learning_rate!r} must be > 0")
        self.wait()
        for t in self.tables:
            t.spec = dataclasses.replace(t.spec, learning_rate=float(learning_rate))
        self._hparams[:, 0] = float(learning_rate)

    @torch.no_grad()
    def dequantize_rows(self, table: int, ids: torch.Tensor) -> torch.Tensor:
        """Current float32[n, D] values of rows ``ids`` (int64[n]) of table ``table``."""
        if not 0 <= table < len(self.tables):
            raise IndexError(f"table {table} out of range [0, {len(self.tables)})")
        ids = ids.to(torch.int64).reshape(-1, 1).contiguous()
        self.check_ids(ids, self._limits[table : table + 1])
        self.wait()
        per = self._per_id[table]
        rows = get_kernels().forward(self.tensors([table]), expand_ids(ids, per))
        return merge_blocks(rows, per)[:, 0, :]

    def memory_report(self) -> dict:
        """Per-table and total bytes (see ``memory.summarize``)."""
        return summarize([t.memory() for t in self.tables])

    def cache_stats(self) -> dict[str, float]:
        """Aggregated (``hit_rate``, ``evictions``, ...) and per-table (``table{i}/...``) stats.

        Hits and misses count lookups (samples); ``prefetch_used`` / ``prefetch_discarded``
        count admissions run ahead that a forward used or not.
        """
        self.wait()
        per = [t.cache_stats() for t in self.tables]
        out: dict[str, float] = {}
        for key in ("hits", "misses", "evictions", "store_writes", "writeback_bytes"):
            out[key] = sum(p[key] for p in per)
        out["capacity_rows"] = sum(p["capacity_rows"] for p in per)
        lookups = out["hits"] + out["misses"]
        out["hit_rate"] = out["hits"] / lookups if lookups else 0.0
        out["prefetch_used"] = float(self.queue.used)
        out["prefetch_discarded"] = float(self.queue.discarded)
        for i, p in enumerate(per):
            out.update({f"table{i}/{k}": v for k, v in p.items()})
        return out
