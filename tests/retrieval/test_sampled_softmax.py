"""Sampled softmax with log-Q: hand-computed losses, accidental hits, negatives, Q estimates."""

from __future__ import annotations

import math

import pytest
import torch

from ssl_rec.objectives import SampledSoftmax, StreamingItemFrequency, counts_log_q, mixed_log_q

EYE = torch.eye(2)


def test_in_batch_loss_with_log_q_matches_hand_computation() -> None:
    log_q = torch.tensor([math.log(2.0), 0.0])
    out = SampledSoftmax(temperature=1.0)(EYE, EYE, torch.tensor([0, 1]), log_q)
    # Row 0 logits [1 - log 2, 0]; row 1 logits [-log 2, 1].
    expected = (math.log(1 + 2 / math.e) + math.log(1 + 0.5 / math.e)) / 2
    assert float(out.loss) == pytest.approx(expected, abs=1e-6)
    assert float(out.logs["in_batch_top1"]) == 1.0
    # Without the correction both rows are -log(e / (e + 1)).
    plain = SampledSoftmax(temperature=1.0, log_q=False)(EYE, EYE, torch.tensor([0, 1]), log_q)
    assert float(plain.loss) == pytest.approx(math.log(1 + 1 / math.e), abs=1e-6)


def test_temperature_divides_the_scores() -> None:
    out = SampledSoftmax(temperature=0.5)(EYE, EYE, torch.tensor([0, 1]))
    assert float(out.loss) == pytest.approx(math.log(1 + math.exp(-2.0)), abs=1e-6)


def test_accidental_hits_leave_the_softmax() -> None:
    q = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    ids = torch.tensor([7, 7, 3])
    out = SampledSoftmax(temperature=1.0)(q, q, ids)
    # Rows 0 and 1 share item 7: each sees only itself and item 3 (scores 1 and 0).
    rows = [math.log(1 + math.exp(-1.0))] * 2 + [math.log(1 + 2 * math.exp(-1.0))]
    assert float(out.loss) == pytest.approx(sum(rows) / 3, abs=1e-6)
    assert float(out.logs["accidental_hits"]) == pytest.approx(2 / 3)
    kept = SampledSoftmax(temperature=1.0, remove_accidental_hits=False)(q, q, ids)
    assert float(kept.loss) > float(out.loss)


def test_uniform_negatives_join_the_candidates_with_their_own_log_q() -> None:
    neg = torch.tensor([[1.0, 0.0]])
    out = SampledSoftmax(temperature=1.0)(
        EYE, EYE, torch.tensor([0, 1]), torch.zeros(2), neg, torch.tensor([5]),
        torch.tensor([math.log(0.5)]),
    )  # fmt: skip
    # Row 0: [1, 0, 1 - log 0.5]; row 1: [0, 1, 0 - log 0.5].
    row0 = -1 + math.log(math.e + 1 + 2 * math.e)
    row1 = -1 + math.log(1 + math.e + 2)
    assert float(out.loss) == pytest.approx((row0 + row1) / 2, abs=1e-6)
    with pytest.raises(ValueError, match="log Q for all candidates or for none"):
        SampledSoftmax()(EYE, EYE, torch.tensor([0, 1]), torch.zeros(2), neg, torch.tensor([5]))


def test_mixed_log_q_adds_the_uniform_rate() -> None:
    got = mixed_log_q(torch.log(torch.tensor([0.25, 2.0])), n_uniform=10, n_items=40)
    torch.testing.assert_close(got.exp(), torch.tensor([0.5, 2.25]))
    torch.testing.assert_close(mixed_log_q(torch.zeros(3), 0, 40), torch.zeros(3))


def test_counts_give_the_expected_count_per_batch() -> None:
    got = counts_log_q(torch.tensor([0, 2, 6]), batch_size=4, smoothing=1.0).exp()
    torch.testing.assert_close(got, torch.tensor([4 / 11, 12 / 11, 28 / 11]))
    with pytest.raises(ValueError, match="all zero"):
        counts_log_q(torch.zeros(3), 4, smoothing=0.0)


def test_streaming_estimate_follows_how_often_items_turn_up() -> None:
    freq = StreamingItemFrequency(buckets=16, alpha=0.1)
    for step in range(400):
        ids = [0, 1] if step % 4 == 0 else [0]
        freq.update(torch.tensor(ids))
    got = freq.log_q(torch.tensor([0, 1])).exp()
    torch.testing.assert_close(got, torch.tensor([1.0, 0.25]), atol=1e-3, rtol=0)
    with pytest.raises(ValueError, match="alpha"):
        StreamingItemFrequency(alpha=0.0)


def test_bad_shapes_and_temperature_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"SampledSoftmax\.temperature must be > 0, got 0.0"):
        SampledSoftmax(temperature=0.0)
    with pytest.raises(ValueError, match="must be"):
        SampledSoftmax()(EYE, torch.eye(3), torch.tensor([0, 1]))
