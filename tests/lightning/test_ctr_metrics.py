import math

import torch

from ssl_rec.metrics import ctr_metrics


def test_ctr_metrics_match_hand_computation():
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0])
    labels = torch.tensor([1.0, 0.0, 0.0, 1.0])
    m = ctr_metrics("test/")
    m.update(logits[:2], labels[:2])
    m.update(logits[2:], labels[2:])
    out = m.compute()
    p = torch.sigmoid(logits)
    bce = -(labels * p.log() + (1 - labels) * (1 - p).log()).mean()
    entropy = -(0.5 * math.log(0.5) * 2)
    # positives have scores 0.88 and 0.047, negatives 0.27 and 0.62 -> 2 of 4 pairs ordered
    assert math.isclose(out["test/auc"].item(), 0.5, abs_tol=1e-6)
    assert math.isclose(out["test/logloss"].item(), bce.item(), rel_tol=1e-5)
    assert math.isclose(out["test/ne"].item(), bce.item() / entropy, rel_tol=1e-5)
    assert math.isclose(out["test/calibration"].item(), p.sum().item() / 2, rel_tol=1e-5)


def test_perfect_ranking_has_auc_one_and_ne_below_one():
    logits = torch.tensor([5.0, 4.0, -4.0, -5.0])
    labels = torch.tensor([1.0, 1.0, 0.0, 0.0])
    m = ctr_metrics("")
    m.update(logits, labels)
    out = m.compute()
    assert out["auc"].item() == 1.0
    assert out["ne"].item() < 0.1
