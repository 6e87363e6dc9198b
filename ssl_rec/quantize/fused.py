"""DLRM served without concatenations: the lookup and interaction write the top MLP's input.

DLRM's forward concatenates twice: the bottom MLP's output before the looked-up rows
(``[B, 1 + T, D]``, the interaction's input) and before the interaction's output (``[B, D +
P]``, the top MLP's input). At batch 4096 these are fresh 6-7 MB tensors, copied once more
each. With the compiled kernels the serving model instead keeps the top MLP's input buffer
per thread, copies the bottom MLP's ``[B, D]`` output into its first ``D`` columns, and has
one kernel look up the rows and write their interaction into the rest: the interaction's
input is gathered a chunk of samples at a time (in the L2 cache, ``serve_interaction``),
never as a whole. The values are the plain forward's, bit for bit (a test checks it).

:func:`dlrm_logits` runs either path stage by stage and can report when each stage ends,
which is how ``benchmarks/inference.py`` times them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from ssl_rec.hardware import serving_kernels
from ssl_rec.models import DLRMEncoder, DotInteraction
from ssl_rec.quantize.dense import PrecisionLayer
from ssl_rec.quantize.tables import QuantizedTables

__all__ = ["FUSED_STAGES", "STAGES", "dlrm_logits", "fusable"]

# The stages :func:`dlrm_logits` reports, in order: the module's forward, the fused one.
STAGES = ("lookup", "bottom_mlp", "interaction", "top_mlp", "head")
FUSED_STAGES = ("bottom_mlp", "lookup_interaction", "top_mlp", "head")

_SCRATCH = threading.local()


def fusable(dense: torch.nn.Module, features: torch.Tensor | None = None) -> bool:
    """Whether ``dense`` (a DenseCTR) is a DLRM whose forward :func:`dlrm_logits` can run.

    A DLRM with a bottom MLP and an FP32 interaction, no hooks on its modules (the numeric
    debugger's hooks must see every layer called with its own input and output), and no
    gradient to record (the kernels have none) for the input ``features``.
    """
    if torch.is_grad_enabled() and (
        (features is not None and features.requires_grad)
        or any(p.requires_grad for p in dense.parameters())
    ):
        return False
    encoder = getattr(dense, "encoder", None)
    if type(encoder) is not DLRMEncoder or encoder.bottom is None:
        return False
    interaction = encoder.interaction
    plain = isinstance(interaction, DotInteraction) or (
        isinstance(interaction, PrecisionLayer)
        and interaction.precision == "fp32"
        and isinstance(interaction.layer, DotInteraction)
    )
    return plain and not any(m._forward_hooks or m._forward_pre_hooks for m in dense.modules())


def _buffer(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A float32 buffer of ``shape`` kept by this thread (grown when too small)."""
    numel = 1
    for size in shape:
        numel *= size
    held = getattr(_SCRATCH, name, None)
    if held is None or held.numel() < numel:
        with torch.inference_mode(False):  # a normal tensor: usable in and out of the mode
            held = torch.empty(numel, dtype=torch.float32)
        setattr(_SCRATCH, name, held)
    return held[:numel].view(shape)


def dlrm_logits(
    tables: QuantizedTables,
    dense_part: torch.nn.Module,
    dense: torch.Tensor,
    sparse: torch.Tensor,
    fused: bool = True,
    mark: Callable[[str], None] | None = None,
) -> torch.Tensor:
    """Click logits ``[B]`` of a :func:`fusable` DLRM, stage by stage.

    Args:
        tables: the embedding tables.
        dense_part: the DenseCTR (encoder and head).
        dense: float32[B, n_dense] dense features.
        sparse: int64[B, T] ids.
        fused: write into the per-thread buffers (needs the compiled kernels); ``False``
            runs the module's own forward (two ``torch.cat``), the same values.
        mark: called with each name of :data:`STAGES` (``fused``: :data:`FUSED_STAGES`) as
            that stage ends.

    """
    encoder, head = dense_part.encoder, dense_part.head
    dense = dense_part.dense_encoding(dense)
    done = mark or (lambda _stage: None)
    if not fused or serving_kernels() is None:
        field_emb = tables(sparse)
        done("lookup")
        dense_emb = encoder.bottom(dense)
        done("bottom_mlp")
        vectors = torch.cat([dense_emb.unsqueeze(1), field_emb], dim=1)
        top_in = torch.cat([dense_emb, encoder.interaction(vectors)], dim=1)
        done("interaction")
    else:
        dense_emb = encoder.bottom(dense).float().contiguous()
        done("bottom_mlp")
        batch, dim, vectors = sparse.shape[0], tables.dim, tables.num_tables + 1
        top_in = _buffer("top_in", (batch, dim + vectors * (vectors - 1) // 2))
        top_in[:, :dim].copy_(dense_emb)
        tables.interaction_into(sparse, dense_emb, top_in, dim)
        done("lookup_interaction")
    pooled = encoder.top(top_in)
    done("top_mlp")
    logits = head(pooled)
    done("head")
    return logits
