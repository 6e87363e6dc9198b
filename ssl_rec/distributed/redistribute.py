"""Moving the rows of a logical tensor between the cyclic shard layout and even row blocks.

Checkpoints store every table tensor in the layout torch.distributed.checkpoint reshards:
the logical (unsharded) tensor cut into ``ceil(L / W)``-row blocks, block ``r`` on rank ``r``
(``torch.chunk``'s split). Training keeps rows cyclic over a table's ranks
(:mod:`ssl_rec.distributed.cyclic_layout`). One ``all_to_all_single`` of the rows' bytes (any dtype)
moves between the two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["block_range", "blocks_to_cyclic", "cyclic_to_blocks"]


def block_range(length: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank``'s block of a ``length``-row tensor (``torch.chunk``)."""
    size = -(-length // world_size) if length else 0
    start = min(length, rank * size)
    return start, min(length, start + size)


def _exchange(
    rows: torch.Tensor,
    dest: torch.Tensor,
    dest_index: torch.Tensor,
    out_rows: int,
    group: dist.ProcessGroup | None,
) -> torch.Tensor:
    """Send ``rows[i]`` to rank ``dest[i]``, placed there at ``dest_index[i]``.

    Args:
        rows: [m, ...] rows of any dtype.
        dest: int64[m] destination ranks.
        dest_index: int64[m] row index at the destination.
        out_rows: Rows of this rank's result.
        group: Process group (default: the world).

    Returns:
        [out_rows, ...] with the received rows in place (rows nobody sent stay zero).

    """
    world, tail = dist.get_world_size(group), rows.shape[1:]
    width = rows.element_size() * math.prod(tail)
    order = torch.argsort(dest, stable=True)
    data = rows[order].contiguous().view(torch.uint8).reshape(-1)
    send = torch.bincount(dest, minlength=world).to(torch.int64)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    send_sizes, recv_sizes = send.tolist(), recv.tolist()
    got_index = torch.empty(sum(recv_sizes), dtype=torch.int64)
    dist.all_to_all_single(got_index, dest_index[order].contiguous(), recv_sizes, send_sizes,
                           group=group)  # fmt: skip
    got = torch.empty(sum(recv_sizes) * width, dtype=torch.uint8)
    dist.all_to_all_single(got, data, [s * width for s in recv_sizes],
                           [s * width for s in send_sizes], group=group)  # fmt: skip
    out = torch.zeros((out_rows, *tail), dtype=rows.dtype)
    out.view(torch.uint8).reshape(out_rows, width)[got_index] = got.view(-1, width)
    return out


def cyclic_to_blocks(
    piece: torch.Tensor | None,
    ranks: Sequence[int],
    length: int,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Collective: the block of a logical tensor whose rows are held cyclically by ``ranks``.

    Args:
        piece: This rank's rows ``[l, ...]`` (global rows ``j + n * l``, ``j`` its index in
            ``ranks``); a rank outside ``ranks`` passes an empty tensor of the same trailing
            shape and dtype.
        ranks: The holders, in shard order (``n = len(ranks)``).
        length: Rows L of the logical tensor.
        group: Process group.

    Returns:
        This rank's block (``block_range``) of the logical tensor.

    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    start, stop = block_range(length, world, rank)
    size = block_range(length, world, 0)[1] or 1
    if rank in ranks:
        j, n = list(ranks).index(rank), len(ranks)
        rows = j + n * torch.arange(piece.shape[0], dtype=torch.int64)
    else:
        rows = torch.zeros(0, dtype=torch.int64)
    return _exchange(piece, rows // size, rows % size, stop - start, group)


def blocks_to_cyclic(
    block: torch.Tensor,
    ranks: Sequence[int],
    length: int,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Collective inverse of :func:`cyclic_to_blocks`: this rank's cyclic rows (maybe empty)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    start, stop = block_range(length, world, rank)
    if block.shape[0] != stop - start:
        raise ValueError(f"block of {block.shape[0]} rows, rank {rank} holds {stop - start}")
    n, rows = len(ranks), torch.arange(start, stop, dtype=torch.int64)
    dest = torch.tensor(list(ranks), dtype=torch.int64)[rows % n] if n else rows
    mine = 0
    if rank in ranks:
        mine = (length - list(ranks).index(rank) + n - 1) // n
    return _exchange(block, dest, rows // n, mine, group)
