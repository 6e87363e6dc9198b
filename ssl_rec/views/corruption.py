"""Feature corruptions applied to a batch inside the model step (batched tensor ops).

Each corruption is a small ``nn.Module`` with ``forward(batch, rng) -> Batch`` so a
:class:`~ssl_rec.views.View` can chain any of them from YAML.
"""

from __future__ import annotations

import torch
from torch import nn

from ssl_rec._checks import check_rate
from ssl_rec._config import RecordsConfig
from ssl_rec.types import Batch


def id_dropout(sparse: torch.Tensor, rate: float, rng: torch.Generator) -> torch.Tensor:
    """Replace each id by the missing/OOV id 0 with probability ``rate``: ``int64[B, F]``."""
    drop = torch.rand(sparse.shape, generator=rng, device=sparse.device) < rate
    return sparse.masked_fill(drop, 0)


def feature_swap(sparse: torch.Tensor, rate: float, rng: torch.Generator) -> torch.Tensor:
    """With probability ``rate`` per entry, take the field's id from another random row.

    Swapping within the batch keeps every field's marginal distribution while breaking the
    row's co-occurrence structure (the "corruption" of Bahri et al., SCARF, ICLR 2022,
    https://arxiv.org/abs/2106.15147). Returns ``int64[B, F]``.
    """
    b, f = sparse.shape
    swap = torch.rand(b, f, generator=rng, device=sparse.device) < rate
    donor = torch.randint(0, b, (b, f), generator=rng, device=sparse.device)
    return torch.where(swap, sparse.gather(0, donor), sparse)


def dense_corruption(
    dense: torch.Tensor, noise_std: float, mask_rate: float, rng: torch.Generator
) -> torch.Tensor:
    """Add Gaussian noise (std ``noise_std``) and zero each entry w.p. ``mask_rate``."""
    out = dense
    if noise_std > 0:
        noise = torch.randn(dense.shape, generator=rng, device=dense.device)
        out = out + noise_std * noise
    if mask_rate > 0:
        drop = torch.rand(dense.shape, generator=rng, device=dense.device) < mask_rate
        out = out.masked_fill(drop, 0.0)
    return out


class IdDropout(RecordsConfig, nn.Module):
    """Replace ids by the OOV id 0 with probability ``rate``.

    Teaches robustness to missing and unseen values.

    Args:
        rate: drop probability in [0, 1].

    """

    def __init__(self, rate: float = 0.1) -> None:
        super().__init__()
        self.rate = check_rate("IdDropout", "rate", rate)

    def forward(self, batch: Batch, rng: torch.Generator) -> Batch:
        """Corrupt ``batch.sparse``."""
        return batch.with_features(sparse=id_dropout(batch.sparse, self.rate, rng))


class FeatureSwap(RecordsConfig, nn.Module):
    """Swap each id with the same field of a random other row w.p. ``rate`` (SCARF).

    Args:
        rate: swap probability in [0, 1].

    """

    def __init__(self, rate: float = 0.2) -> None:
        super().__init__()
        self.rate = check_rate("FeatureSwap", "rate", rate)

    def forward(self, batch: Batch, rng: torch.Generator) -> Batch:
        """Corrupt ``batch.sparse``."""
        return batch.with_features(sparse=feature_swap(batch.sparse, self.rate, rng))


class DenseNoise(RecordsConfig, nn.Module):
    """Gaussian noise on the dense features, plus random zeroing.

    Args:
        std: noise standard deviation (>= 0), in units of the (``log1p``) dense features.
        mask_rate: probability of zeroing each dense entry, in [0, 1].

    """

    def __init__(self, std: float = 0.1, mask_rate: float = 0.0) -> None:
        super().__init__()
        if std < 0:
            raise ValueError(f"DenseNoise.std must be >= 0, got {std}")
        self.std = float(std)
        self.mask_rate = check_rate("DenseNoise", "mask_rate", mask_rate)

    def forward(self, batch: Batch, rng: torch.Generator) -> Batch:
        """Corrupt ``batch.dense``."""
        return batch.with_features(
            dense=dense_corruption(batch.dense, self.std, self.mask_rate, rng)
        )
