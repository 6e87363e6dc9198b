"""Linear (logistic-regression) CTR probe on frozen representations, in torch."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ssl_rec.metrics import binary_auc, binary_logloss


def linear_probe(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    weight_decay: float = 1e-4,
    max_iter: int = 100,
) -> dict[str, float]:
    """Fit ``p = sigmoid(w . standardise(x) + b)`` by full-batch L-BFGS; score the test rows.

    Args:
        train_x: ``float32[n, H]`` training representations.
        train_y: ``float[n]`` labels in {0, 1}.
        test_x: ``float32[m, H]`` test representations.
        test_y: ``float[m]`` labels in {0, 1}.
        weight_decay: L2 penalty on ``w`` (>= 0).
        max_iter: L-BFGS iterations.

    Returns:
        ``{"auc", "logloss"}`` on the test rows.

    """
    if weight_decay < 0:
        raise ValueError(f"linear probe weight_decay must be >= 0, got {weight_decay}")
    xtr = torch.as_tensor(np.asarray(train_x), dtype=torch.float32)
    xte = torch.as_tensor(np.asarray(test_x), dtype=torch.float32)
    ytr = torch.as_tensor(np.asarray(train_y), dtype=torch.float32)
    if xtr.dim() != 2 or xte.dim() != 2 or xtr.shape[1] != xte.shape[1] or len(ytr) != len(xtr):
        raise ValueError(
            f"linear probe needs train [n, H], labels [n], test [m, H]; got {tuple(xtr.shape)}, "
            f"{tuple(ytr.shape)}, {tuple(xte.shape)}"
        )
    mean, std = xtr.mean(0), xtr.std(0).clamp_min(1e-6)
    xtr, xte = (xtr - mean) / std, (xte - mean) / std
    w = torch.zeros(xtr.shape[1], requires_grad=True)
    prior = ytr.mean().clamp(1e-4, 1 - 1e-4)
    b = torch.log(prior / (1 - prior)).clone().requires_grad_(True)
    opt = torch.optim.LBFGS([w, b], max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = (
            F.binary_cross_entropy_with_logits(xtr @ w + b, ytr) + weight_decay * w.square().sum()
        )
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    with torch.no_grad():
        prob = torch.sigmoid(xte @ w + b).numpy()
    return {"auc": binary_auc(prob, test_y), "logloss": binary_logloss(prob, test_y)}
