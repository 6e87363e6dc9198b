"""Which items the item-side self-supervised objectives see: batch, uniform or a mix."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from ssl_rec._checks import check_at_least, check_choice

SslItems = Literal["batch", "uniform", "mixed"]
SSL_ITEM_SOURCES = ("batch", "uniform", "mixed")


class SslItemSampler(nn.Module):
    """Draws the rows of the item catalogue that an item-side objective contrasts.

    The training batch's items follow the interactions, so they are mostly popular items; Yao
    et al. (CIKM 2021, Section 3.4) draw the self-supervised batch uniformly from the corpus
    instead, which is what reaches the long tail. ``uniform`` draws ``size`` distinct
    catalogue rows uniformly (every row has probability ``size / N`` per draw); ``mixed``
    takes half the rows from the training batch and the rest uniformly; ``batch`` keeps the
    training batch's items. Draws come from the sampler's own seeded generator, whose state
    travels in ``state_dict`` (a resumed run continues the sequence).

    Args:
        source: ``batch``, ``uniform`` or ``mixed``.
        size: rows per draw (``0``: as many as the training batch).
        seed: seed of the generator.

    """

    def __init__(self, source: SslItems = "batch", size: int = 0, seed: int = 0) -> None:
        super().__init__()
        self.source = check_choice("RetrievalModule", "ssl_items", source, SSL_ITEM_SOURCES)
        self.size = check_at_least("RetrievalModule", "ssl_batch_size", size, 0)
        self.seed = int(seed)
        self._rng: torch.Generator | None = None

    def _generator(self) -> torch.Generator:
        if self._rng is None:
            self._rng = torch.Generator().manual_seed(self.seed)
        return self._rng

    def get_extra_state(self) -> dict:
        """The generator's position (empty before the first draw)."""
        return {} if self._rng is None else {"rng": self._rng.get_state()}

    def set_extra_state(self, state: dict) -> None:
        """Restore :meth:`get_extra_state` (an empty state restarts from ``seed``)."""
        self._rng = None
        if state and state.get("rng") is not None:
            self._generator().set_state(state["rng"])

    def uniform_rows(self, n_items: int, size: int) -> torch.Tensor:
        """``int64[min(size, n_items)]`` distinct rows of ``range(n_items)``, uniformly."""
        return torch.randperm(n_items, generator=self._generator())[: min(size, n_items)]

    def catalogue_rows(self, n_items: int, batch_size: int) -> tuple[int, torch.Tensor]:
        """``(k, rows)``: keep the batch's first ``k`` items and add catalogue ``rows``.

        Args:
            n_items: ``N``, rows of the catalogue.
            batch_size: ``B``, rows of the training batch.

        Returns:
            ``k`` (``B`` for ``batch``, 0 for ``uniform``, half the draw for ``mixed``) and
            ``int64[size - k]`` catalogue rows drawn uniformly (empty for ``batch``).

        """
        size = self.size or batch_size
        if self.source == "batch":
            return min(size, batch_size), torch.empty(0, dtype=torch.long)
        keep = min(size // 2, batch_size) if self.source == "mixed" else 0
        return keep, self.uniform_rows(n_items, size - keep)
