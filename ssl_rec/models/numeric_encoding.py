"""Dense columns standardized with their training statistics, kept as buffers of the model.

The statistics are fitted by ``data`` on the training split
(:class:`~ssl_rec.vocab.DenseStatistics`) and become buffers here, so a checkpoint, a
fine-tuned model and a quantized one standardize new data with the statistics the weights
were trained for. A state dict written before the buffers existed loads as the identity:
those weights were trained on unstandardized columns.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import torch
from torch import nn

from ssl_rec.models.numeric_tokens import TOKEN_ENCODINGS
from ssl_rec.vocab import DenseStatistics

# Token encodings standardize first: the tokenizer reads standardized values.
DENSE_ENCODINGS = ("standardize", "none", *TOKEN_ENCODINGS)
_BUFFERS = ("mean", "std")
# A constant training column keeps scale 1: dividing by ~0 would blow up unseen values.
_MIN_STD = 1e-6


def check_dense_encoding(value: str) -> str:
    """``value`` if it names a dense encoding (``ValueError`` listing them otherwise)."""
    if value not in DENSE_ENCODINGS:
        raise ValueError(f"dense_encoding must be one of {list(DENSE_ENCODINGS)}, got {value!r}")
    return value


class DenseStandardizer(nn.Module):
    """``(x - mean) / std`` per dense column, with the training statistics as buffers.

    Until statistics are set (or loaded) it is the identity (``mean = 0``, ``std = 1``); with
    ``encoding="none"`` it stays the identity whatever is set.

    Args:
        n_dense: number of dense columns ``n``.
        encoding: ``"standardize"``, ``"none"``, or a token encoding (``"quantile_tokens"``,
            ``"periodic_tokens"``: standardized here, tokenized after).

    Shape:
        ``float32[B, n] -> float32[B, n]``.

    """

    def __init__(self, n_dense: int, encoding: str = "standardize") -> None:
        super().__init__()
        self.encoding = check_dense_encoding(encoding)
        self.register_buffer("mean", torch.zeros(n_dense))
        self.register_buffer("std", torch.ones(n_dense))
        self.fitted = False

    @property
    def n_dense(self) -> int:
        """Number of dense columns."""
        return int(self.mean.numel())

    def set_statistics(self, statistics: DenseStatistics | None) -> None:
        """Take the training ``statistics`` (``None``: back to the identity, not fitted).

        Raises:
            ValueError: when they describe another number of columns.

        """
        if statistics is None:
            self.mean.zero_()
            self.std.fill_(1.0)
            self.fitted = False
            return
        if len(statistics.columns) != self.n_dense:
            raise ValueError(
                f"dense statistics of {len(statistics.columns)} columns "
                f"{list(statistics.columns)[:5]} for a model of {self.n_dense} dense columns"
            )
        if self.encoding != "none":
            std = torch.as_tensor(statistics.std, dtype=torch.float32)
            self.mean.copy_(torch.as_tensor(statistics.mean, dtype=torch.float32))
            self.std.copy_(torch.where(std > _MIN_STD, std, torch.ones_like(std)))
        self.fitted = True

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        """Standardized ``dense``."""
        if self.encoding == "none":
            return dense
        return (dense - self.mean.to(dense.dtype)) / self.std.to(dense.dtype)

    def inverse(self, standardized: torch.Tensor) -> torch.Tensor:
        """The raw values whose standardization is ``standardized`` (``[B, n]``)."""
        if self.encoding == "none":
            return standardized
        return standardized * self.std.to(standardized.dtype) + self.mean.to(standardized.dtype)

    def _load_from_state_dict(
        self,
        state_dict: MutableMapping[str, Any],
        prefix: str,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        fill_legacy_dense_state(state_dict, prefix, self.n_dense)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self.fitted = True

    def extra_repr(self) -> str:
        """``n_dense=…, encoding=…``."""
        return f"n_dense={self.n_dense}, encoding={self.encoding!r}"


def fill_legacy_dense_state(
    state: MutableMapping[str, Any], prefix: str, n_dense: int
) -> MutableMapping[str, Any]:
    """Give a state dict written before the standardizer the identity's buffers (in place).

    Args:
        state: a state dict (of the module at ``prefix``'s parent, or any ancestor).
        prefix: the standardizer's key prefix (``"dense_encoding."``).
        n_dense: number of dense columns.

    Returns:
        ``state``: untouched when it holds the buffers, else with ``mean = 0``, ``std = 1``.

    """
    if not any(prefix + name in state for name in _BUFFERS):
        state[prefix + "mean"] = torch.zeros(n_dense)
        state[prefix + "std"] = torch.ones(n_dense)
    return state


def legacy_dense_state(state: Mapping[str, Any], prefix: str, n_dense: int) -> dict[str, Any]:
    """A copy of ``state`` with the identity's buffers where it has none (see above)."""
    return dict(fill_legacy_dense_state(dict(state), prefix, n_dense))
