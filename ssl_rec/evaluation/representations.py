"""Frozen representations of a data split: pooled vectors with their row ids and labels."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ssl_rec.types import BackboneProtocol, Batch


@dataclass(frozen=True)
class RepresentationSet:
    """Pooled representations of ``n`` rows.

    Args:
        vectors: ``float32[n, H]`` pooled backbone outputs.
        row_ids: ``int64[n]`` row position in the split (``Batch.row_id``, else a counter).
        labels: ``float32[n]`` click labels, or ``None`` for unlabeled data.

    """

    vectors: np.ndarray
    row_ids: np.ndarray
    labels: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.vectors)
        if self.vectors.ndim != 2:
            raise ValueError(f"RepresentationSet.vectors must be [n, H], got {self.vectors.shape}")
        if self.row_ids.shape != (n,):
            raise ValueError(f"RepresentationSet.row_ids must be [{n}], got {self.row_ids.shape}")
        if self.labels is not None and self.labels.shape != (n,):
            raise ValueError(f"RepresentationSet.labels must be [{n}], got {self.labels.shape}")

    def __len__(self) -> int:
        return len(self.vectors)


def backbone_of(model: nn.Module) -> BackboneProtocol:
    """Return the backbone of an ssl-rec LightningModule (``.backbone``), or ``model``."""
    backbone = getattr(model, "backbone", model)
    if not isinstance(backbone, BackboneProtocol):
        raise TypeError(
            f"{type(model).__name__} is neither an ssl-rec Backbone nor a module with a "
            "`.backbone` (CTRModule, PretrainModule)"
        )
    return backbone


@torch.no_grad()
def compute_representations(
    model: nn.Module,
    batches: Iterable[Batch],
    max_rows: int | None = None,
    progress: bool = False,
) -> RepresentationSet:
    """Run the backbone in eval mode over ``batches`` and collect ``pooled`` vectors.

    Args:
        model: a Backbone or a module with ``.backbone``.
        batches: e.g. a split's ``DataLoader`` of :class:`~ssl_rec.types.Batch`.
        max_rows: stop after this many rows (``None``: all).
        progress: show a tqdm bar.

    Returns:
        A :class:`RepresentationSet` with ``vectors float32[n, H]``.

    """
    backbone = backbone_of(model)
    was_training = backbone.training
    backbone.eval()
    vectors, row_ids, labels = [], [], []
    seen = 0
    try:
        # disable=None: a bar on a terminal only, never redrawn into a log file.
        shown = None if progress else True
        for batch in tqdm(batches, desc="representations", disable=shown, unit="batch"):
            pooled = backbone(batch).pooled.float().cpu().numpy()
            n = len(pooled)
            ids = (
                batch.row_id.cpu().numpy()
                if batch.row_id is not None
                else np.arange(seen, seen + n)
            )
            vectors.append(pooled)
            row_ids.append(ids.astype(np.int64))
            if batch.label is not None:
                labels.append(batch.label.float().cpu().numpy())
            seen += n
            if max_rows is not None and seen >= max_rows:
                break
    finally:
        backbone.train(was_training)
    if not vectors:
        raise ValueError("compute_representations got no batches")
    stack = np.concatenate(vectors)[:max_rows]
    y = np.concatenate(labels)[:max_rows] if len(labels) == len(vectors) else None
    return RepresentationSet(stack, np.concatenate(row_ids)[:max_rows], y)
