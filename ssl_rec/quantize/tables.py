"""``QuantizedTables``: inference-only embedding tables, each at its own precision.

Rows use the library's formats (:class:`ssl_rec.hardware.Precision`): FBGEMM's fused
row-wise rows for INT8/INT4/INT2, plain FP32/FP16/BF16 rows otherwise. Tables of one
precision are packed into one store (a table-batched layout, as FBGEMM's TBE does), so a
batch costs one lookup call per precision: ``torch.ops.quantized.embedding_bag_byte /
_4bit / _2bit_rowwise_offsets`` read the fused rows unchanged, ``embedding_bag`` the floats.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ssl_rec.hardware import (
    Precision,
    dequantize_rows,
    quantize_rows,
    serving_kernels,
    uncached_tables,
)
from ssl_rec.hardware.inference import TableTensors

__all__ = ["QuantizedTables", "lookup_rows"]

_FUSED_OPS = {
    8: "embedding_bag_byte_rowwise_offsets",
    4: "embedding_bag_4bit_rowwise_offsets",
    2: "embedding_bag_2bit_rowwise_offsets",
}


def lookup_rows(store: torch.Tensor, precision: Precision, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids int64[N]`` of a store in ``precision``: ``float32[N, D]`` (no range check).

    One id per bag through the pooled embedding-bag kernels, which are the fast paths on
    CPU (FBGEMM for the fused rows, ATen's ``embedding_bag`` for floats).
    """
    bags = torch.arange(ids.numel() + 1, dtype=torch.int64)
    if precision.is_float:
        rows = F.embedding_bag(ids, store, bags, mode="sum", include_last_offset=True)
        return rows.float()
    op = getattr(torch.ops.quantized, _FUSED_OPS[precision.bits])
    return op(store, ids, bags, False, 0, False, None, None, True)


class QuantizedTables(nn.Module):
    """``F`` embedding tables at per-table precisions, packed one store per precision.

    Args:
        cardinalities: rows of each table.
        dim: ``D``.
        precisions: storage format of each table.
        stores: stored rows of each table (``quantize_rows`` output, ``[R_f, row_bytes]``
            uint8 or ``[R_f, D]`` float); ``None`` allocates zeros (to load a state into).

    Shape:
        ``sparse int64[B, F] -> float32[B, F, D]``.

    Example:
        >>> tables = QuantizedTables.from_float([torch.randn(5, 8)], ["int4"])
        >>> tables(torch.tensor([[1], [4]])).shape
        torch.Size([2, 1, 8])

    """

    def __init__(
        self,
        cardinalities: Sequence[int],
        dim: int,
        precisions: Sequence[Precision | str],
        stores: Sequence[torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.cardinalities = [int(c) for c in cardinalities]
        self.precisions = [Precision(p) for p in precisions]
        self.dim = int(dim)
        if len(self.precisions) != len(self.cardinalities):
            raise ValueError(
                f"{len(self.precisions)} precisions for {len(self.cardinalities)} tables"
            )
        for p in set(self.precisions):
            p.check_dim(self.dim)
        self.register_buffer("limits", torch.tensor(self.cardinalities), persistent=False)
        self.groups = [p for p in Precision if p in self.precisions]
        for p in self.groups:
            fields = [f for f, q in enumerate(self.precisions) if q is p]
            rows = [self.cardinalities[f] for f in fields]
            starts = torch.tensor([0, *rows[:-1]], dtype=torch.int64).cumsum(0)
            self.register_buffer(f"fields_{p}", torch.tensor(fields), persistent=False)
            self.register_buffer(f"starts_{p}", starts, persistent=False)
            if stores is None:
                packed = torch.zeros(p.store_shape(sum(rows), self.dim), dtype=p.dtype)
            else:
                packed = torch.cat([stores[f] for f in fields])
            self.register_buffer(f"store_{p}", packed)
        self._kernel_tables: tuple = ((), None)  # (the stores it views, TableTensors)

    @classmethod
    def from_float(
        cls, weights: Sequence[torch.Tensor], precisions: Sequence[Precision | str]
    ) -> QuantizedTables:
        """Quantize FP32 ``[R_f, D]`` weights (round to nearest) into ``precisions``."""
        stores = [quantize_rows(w.float(), p) for w, p in zip(weights, precisions, strict=True)]
        return cls([len(w) for w in weights], int(weights[0].shape[1]), precisions, stores)

    @property
    def num_tables(self) -> int:
        """Number of tables ``F``."""
        return len(self.cardinalities)

    def store(self, precision: Precision) -> torch.Tensor:
        """The packed store of the tables kept in ``precision``."""
        return getattr(self, f"store_{precision}")

    def table_store(self, table: int) -> torch.Tensor:
        """The stored rows of table ``table`` (a view into its precision's packed store)."""
        p = self.precisions[table]
        fields = getattr(self, f"fields_{p}").tolist()
        start = int(getattr(self, f"starts_{p}")[fields.index(table)])
        return self.store(p)[start : start + self.cardinalities[table]]

    def rows(self, table: int, ids: torch.Tensor) -> torch.Tensor:
        """Dequantized ``float32[n, D]`` rows ``ids int64[n]`` of table ``table``."""
        return dequantize_rows(self.table_store(table)[ids], self.precisions[table], self.dim)

    def forward(self, sparse: torch.Tensor) -> torch.Tensor:
        """Look up one id per field (ids checked: the fused kernels do not bound-check)."""
        kernels = serving_kernels()
        if kernels is not None and sparse.dim() == 2 and sparse.shape[1] == self.num_tables:
            try:  # the kernel checks the ids itself, in the same pass as the lookup
                return kernels.serve_lookup(self._tables_view(), sparse.contiguous())
            except IndexError:
                self._check(sparse)  # names the row, table and id
                raise
        self._check(sparse)
        batch = sparse.shape[0]
        if len(self.groups) == 1:  # one store: the lookup output is already [B, F, D]
            p = self.groups[0]
            ids = (sparse + getattr(self, f"starts_{p}")).reshape(-1)
            return lookup_rows(self.store(p), p, ids).view(batch, self.num_tables, self.dim)
        # Bags in field-major order: each group's rows land as whole [B, D] blocks of one
        # field-major output, whose transpose is the [B, F, D] result (no reordering pass).
        by_field = sparse.t()
        out = torch.empty(self.num_tables, batch, self.dim)
        for p in self.groups:
            fields = getattr(self, f"fields_{p}")
            ids = by_field.index_select(0, fields) + getattr(self, f"starts_{p}")[:, None]
            rows = lookup_rows(self.store(p), p, ids.reshape(-1))
            out.index_copy_(0, fields, rows.view(len(fields), batch, self.dim))
        return out.transpose(0, 1)

    def interaction_into(
        self, sparse: torch.Tensor, first: torch.Tensor, out: torch.Tensor, column: int
    ) -> None:
        """Look up ``sparse`` and write DLRM's interaction of ``[first, rows]`` into ``out``.

        Compiled kernels only; see ``CompiledKernels.serve_interaction``.

        Args:
            sparse: int64[B, F] ids.
            first: contiguous float32[B, D], the vector before each sample's rows.
            out: contiguous float32[B, C]; columns ``column .. column + (F + 1) F / 2 - 1``
                receive the pairwise dot products.
            column: first column written.

        Raises:
            RuntimeError: without the compiled kernels.
            IndexError: naming the row, table and id of an id out of range.

        """
        kernels = serving_kernels()
        if kernels is None:
            raise RuntimeError("QuantizedTables.interaction_into needs the compiled kernels")
        self._check_shape(sparse)
        try:  # the kernel checks the ids itself, in the same pass as the lookup
            kernels.serve_interaction(self._tables_view(), sparse.contiguous(), first, out, column)
        except IndexError:
            self._check(sparse)
            raise

    def _tables_view(self) -> TableTensors:
        """The compiled kernels' view of the tables, rebuilt when a store is replaced."""
        stores = tuple(self._buffers[f"store_{p}"] for p in self.groups)
        seen, view = self._kernel_tables
        if len(seen) != len(stores) or any(a is not b for a, b in zip(seen, stores, strict=True)):
            views = [self.table_store(f) for f in range(self.num_tables)]
            view = uncached_tables(views, [p.code for p in self.precisions], self.dim)
            self._kernel_tables = (stores, view)
        return view

    def table_bytes(self) -> list[int]:
        """Stored bytes of each table (rows, scales and biases)."""
        return [
            p.row_bytes(self.dim) * c
            for p, c in zip(self.precisions, self.cardinalities, strict=True)
        ]

    def get_extra_state(self) -> dict:
        """The layout travels with the state, so a saved state names its formats."""
        return {
            "cardinalities": self.cardinalities,
            "dim": self.dim,
            "precisions": [p.value for p in self.precisions],
        }

    def set_extra_state(self, state: dict) -> None:
        """Refuse a state of another layout (it would reinterpret the stores' bytes)."""
        if state != self.get_extra_state():
            raise ValueError(
                f"saved tables {state['precisions']} do not match this model's "
                f"{[p.value for p in self.precisions]}"
            )

    def _check_shape(self, sparse: torch.Tensor) -> None:
        if sparse.dim() != 2 or sparse.shape[1] != self.num_tables:
            raise ValueError(
                f"sparse ids have shape {tuple(sparse.shape)}; the tables need "
                f"[B, {self.num_tables}]"
            )

    def _check(self, sparse: torch.Tensor) -> None:
        self._check_shape(sparse)
        if sparse.numel() == 0:
            return
        low, high = torch.aminmax(sparse, dim=0)  # one pass over the ids
        if not bool((low < 0).any() | (high >= self.limits).any()):
            return
        bad = (sparse < 0) | (sparse >= self.limits)
        if bool(bad.any()):
            row, field = (int(i[0]) for i in torch.nonzero(bad, as_tuple=True))
            raise IndexError(
                f"row {row}, table {field}: id {int(sparse[row, field])} outside "
                f"0..{self.cardinalities[field] - 1}"
            )
