"""The objectives' fused losses and gathers compute what their plain formulations compute.

Each reference below is the straightforward autograd formulation (per-field loops, a
materialized similarity matrix, ``F.cross_entropy``); the library's versions must give the
same loss and the same gradients (bit for bit where the arithmetic is the same, else to
float32 rounding).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from ssl_rec.objectives import (
    AdversarialFeatureReplacement,
    MaskedFeaturePrediction,
    ReplacedFeatureDetection,
    _inplace_softmax,
    nt_xent,
)
from ssl_rec.objectives._candidates import (
    candidate_logits,
    candidate_mix,
    gumbel_argmax,
    gumbel_noise,
)
from ssl_rec.objectives._inplace_softmax import (
    consumed_cross_entropy,
    entropy_and_cross_entropy,
)
from ssl_rec.objectives._replacement import Proposal, detection_loss, replace_ids
from ssl_rec.objectives.momentum_contrast import _QueueContrast
from ssl_rec.types import BackboneProtocol, Batch
from ssl_rec.views import RandomFieldMask, View


def plain_candidate_logits(query, fields, target_emb, target_ids, cand_emb, cand_ids):  # noqa: ANN001, ANN201
    """Per-field products concatenated and put back in row order, duplicates at -inf."""
    pos = (query * target_emb).sum(-1, keepdim=True)
    neg = query.new_empty(query.shape[0], cand_emb.shape[0])
    blocks = []
    for f in fields.unique().tolist():
        rows = (fields == f).nonzero().squeeze(1)
        block = query[rows] @ cand_emb[:, f].T
        same = cand_ids[:, f].unsqueeze(0) == target_ids[rows, None]
        blocks.append((rows, block.masked_fill(same, float("-inf"))))
    order = torch.cat([r for r, _ in blocks])
    neg = torch.cat([b for _, b in blocks])[torch.argsort(order)]
    return torch.cat([pos, neg], dim=1)


def _candidate_inputs(seed: int, m: int = 300, c: int = 16, n_fields: int = 5, d: int = 8):
    g = torch.Generator().manual_seed(seed)
    fields = torch.randint(0, n_fields, (m,), generator=g)
    cand_ids = torch.randint(0, 6, (c, n_fields), generator=g)
    target_ids = torch.randint(0, 6, (m,), generator=g)
    tensors = [torch.randn(m, d, generator=g), torch.randn(m, d, generator=g),
               torch.randn(c, n_fields, d, generator=g)]  # fmt: skip
    return fields, target_ids, cand_ids, tensors


@pytest.mark.parametrize("seed", [0, 1])
def test_candidate_logits_equal_the_plain_formulation_with_their_gradients(seed: int) -> None:
    fields, target_ids, cand_ids, tensors = _candidate_inputs(seed)
    results = []
    for fn in (candidate_logits, plain_candidate_logits):
        query, target, cand = (t.clone().requires_grad_() for t in tensors)
        logits = fn(query, fields, target, target_ids, cand, cand_ids)
        F.cross_entropy(logits, torch.zeros_like(fields), reduction="sum").backward()
        results.append((logits.detach(), query.grad, target.grad, cand.grad))
    assert torch.isinf(results[0][0]).any()  # some candidates hold the true id
    for ours, plain in zip(*results, strict=True):
        assert torch.equal(ours, plain)


def test_candidate_logits_without_gradients_for_the_embeddings() -> None:
    fields, target_ids, cand_ids, (query, target, cand) = _candidate_inputs(2)
    query.requires_grad_()
    logits = candidate_logits(query, fields, target, target_ids, cand, cand_ids)
    logits.logsumexp(1).sum().backward()
    assert query.grad is not None and torch.isfinite(query.grad).all()
    empty = candidate_logits(query[:0], fields[:0], target[:0], target_ids[:0], cand, cand_ids)
    assert empty.shape == (0, 1 + cand.shape[0])


class PlainMaskedFeaturePrediction(MaskedFeaturePrediction):
    """Masked feature prediction written with a loop over fields and whole-tensor normalization."""

    def forward(self, batch: Batch, backbone: BackboneProtocol):  # noqa: ANN201
        out = self.view(batch, backbone)
        b = batch.sparse.shape[0]
        pooled = F.layer_norm(out.rep.pooled, out.rep.pooled.shape[-1:])
        query = rearrange(self.query(pooled), "b (t d) -> b t d", d=backbone.dims.embedding_dim)
        total = query.sum() * 0.0
        for classifier, f in zip(self.classifiers, self.small_fields, strict=True):
            rows = out.field_mask[:, f].nonzero().squeeze(1)
            if rows.numel():
                logits = classifier(query[rows, f])
                total = total + F.cross_entropy(logits, batch.sparse[rows, f], reduction="sum")
        rows, fields = (out.field_mask & self.large_field).nonzero(as_tuple=True)
        emb = F.normalize(backbone.embed(batch.sparse), dim=-1)
        cand = min(self.num_candidates, b)
        logits = plain_candidate_logits(
            F.normalize(query[rows, fields], dim=-1) / self.temperature, fields,
            emb[rows, fields], batch.sparse[rows, fields], emb[:cand], batch.sparse[:cand],
        )  # fmt: skip
        total = total + F.cross_entropy(logits, torch.zeros_like(rows), reduction="sum")
        return total / out.field_mask.sum().clamp_min(1)


def test_masked_feature_prediction_equals_its_plain_formulation(make_backbone, make_batch) -> None:  # noqa: ANN001
    batch = make_batch(128)
    losses, grads, tables = [], [], []
    for cls in (MaskedFeaturePrediction, PlainMaskedFeaturePrediction):
        torch.manual_seed(0)  # the encoder's and the heads' initialization
        backbone = make_backbone()
        objective = cls(View(RandomFieldMask(0.5), seed=3), full_softmax_max=40, num_candidates=32)
        objective.setup(backbone)
        out = objective(batch, backbone)
        loss = out if isinstance(out, torch.Tensor) else out.loss
        loss.backward()  # also applies the tables' fused update
        losses.append(loss.detach())
        grads.append({n: p.grad for n, p in objective.named_parameters()})
        grads[-1].update({n: p.grad for n, p in backbone.named_parameters()})
        tables.append(copy.deepcopy(backbone.embedding.state_dict()))
    assert torch.equal(losses[0], losses[1])
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():  # softmax - onehot in place: equal to rounding
        torch.testing.assert_close(grad, grads[1][name], msg=name)
    # A row both a target and a candidate: the two normalizations' gradients are summed
    # after (not before) normalize's backward, so the update agrees to rounding.
    assert_same_state(tables[0], tables[1])


def assert_same_state(ours: object, plain: object, where: str = "") -> None:
    """Equal tensors (to float32 rounding) and equal plain values, through nested dicts."""
    if isinstance(ours, dict):
        assert ours.keys() == plain.keys(), where
        for key, value in ours.items():
            assert_same_state(value, plain[key], f"{where}.{key}")
    elif isinstance(ours, torch.Tensor):
        torch.testing.assert_close(ours, plain, msg=where)
    else:
        assert ours == plain, where


def plain_nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCLR's loss through a materialized, masked similarity matrix and F.cross_entropy."""
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    sim = z @ z.T / temperature
    n = z1.shape[0]
    sim = sim.masked_fill(torch.eye(2 * n, dtype=torch.bool), float("-inf"))
    target = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
    return F.cross_entropy(sim, target)


@pytest.mark.parametrize("block_rows", [None, 1, 5, 32])
@pytest.mark.parametrize("temperature", [0.05, 0.5])
def test_nt_xent_equals_the_plain_formulation_with_its_gradient(
    temperature: float, block_rows: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One block of similarity rows or many (an uneven last one): the plain loss and gradient."""
    if block_rows is not None:
        monkeypatch.setattr(_inplace_softmax, "BLOCK_LOGITS", block_rows * 74)
    g = torch.Generator().manual_seed(0)
    inputs = torch.randn(37, 6, generator=g), torch.randn(37, 6, generator=g)
    results = []
    for fn in (nt_xent, plain_nt_xent):
        z1, z2 = (t.clone().requires_grad_() for t in inputs)
        loss = fn(z1, z2, temperature)
        (3.0 * loss).backward()
        results.append((loss.detach(), z1.grad, z2.grad))
    for ours, plain in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(ours, plain)
    with torch.no_grad():
        assert torch.equal(nt_xent(*inputs, temperature), results[0][0])
    # A temperature so small that exp underflows for every negative: still finite.
    z1, z2 = (t.clone().requires_grad_() for t in inputs)
    loss = nt_xent(z1, z2, 1e-3)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(z1.grad).all()


@pytest.mark.parametrize("block_rows", [None, 1, 5, 32])
def test_queue_contrast_equals_the_concatenated_logits_cross_entropy(
    block_rows: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One block or many (an uneven last one): the loss and gradient of the plain formula."""
    if block_rows is not None:
        monkeypatch.setattr(_inplace_softmax, "BLOCK_LOGITS", block_rows * 71)
    g = torch.Generator().manual_seed(1)
    q0 = F.normalize(torch.randn(33, 8, generator=g), dim=1)
    k = F.normalize(torch.randn(33, 8, generator=g), dim=1)
    queue = F.normalize(torch.randn(70, 8, generator=g), dim=1)
    results = []
    for fused in (True, False):
        q = q0.clone().requires_grad_()
        if fused:
            stored = queue.clone()
            loss = _QueueContrast.apply(q, k, stored, 0.2)
            stored.zero_()  # MoCo enqueues in place before backward: backward must not see it
        else:
            logits = torch.cat([(q * k).sum(1, keepdim=True), q @ queue.T], dim=1) / 0.2
            loss = F.cross_entropy(logits, torch.zeros(33, dtype=torch.long))
        (2.0 * loss).backward()
        results.append((loss.detach(), q.grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-6, atol=0)
    torch.testing.assert_close(results[0][1], results[1][1])
    with torch.no_grad():  # no gradient wanted: the loss alone
        torch.testing.assert_close(_QueueContrast.apply(q0, k, queue, 0.2), results[1][0],
                                   rtol=1e-6, atol=0)  # fmt: skip


@pytest.mark.parametrize("rows_per_draw", [1, 7, 1024])
@pytest.mark.parametrize(("temperature", "exclude_first"), [(1.0, False), (0.7, True)])
def test_gumbel_argmax_draws_the_full_size_noise_in_blocks(
    rows_per_draw: int, temperature: float, exclude_first: bool
) -> None:
    logits = torch.randn(50, 9, generator=torch.Generator().manual_seed(0))
    logits[3, 1:] = float("-inf")  # only the true id left (or, excluded, nothing)
    logits[4] = 0.5  # ties everywhere
    gen = torch.Generator().manual_seed(5)
    noisy = logits / temperature + gumbel_noise(logits.shape, gen, logits.device)
    if exclude_first:
        noisy[:, 0] = float("-inf")
    gen.manual_seed(5)
    ours = gumbel_argmax(logits, gen, temperature, exclude_first, rows_per_draw)
    assert torch.equal(ours, noisy.argmax(1))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_consumed_cross_entropy_equals_cross_entropy(reduction: str) -> None:
    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn(40, 11, generator=g), torch.randint(0, 11, (40,), generator=g)
    logits[:, 5] = float("-inf")
    results = []
    for fn in (consumed_cross_entropy, F.cross_entropy):
        x = logits.clone().requires_grad_()
        loss = fn(x * 1.0, target, reduction=reduction)  # a fresh tensor to consume
        (1.5 * loss).backward()
        results.append((loss.detach(), x.grad))
    assert torch.equal(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])
    with pytest.raises(ValueError, match="reduction"):
        consumed_cross_entropy(logits.clone(), target, reduction="none")


class PlainReplacedFeatureDetection(ReplacedFeatureDetection):
    """The detection objective with one full-size noise draw and F.cross_entropy."""

    def forward(self, batch: Batch, backbone: BackboneProtocol):  # noqa: ANN201
        batch, proposal = self.propose(batch, backbone)
        with torch.no_grad():
            gen = self.view.rng(batch.sparse.device)
            noise = gumbel_noise(proposal.logits.shape, gen, proposal.logits.device)
            choice = (proposal.logits / self.sample_temperature + noise).argmax(1)
        corrupted = replace_ids(batch.sparse, proposal, choice)
        rep = backbone(batch.with_features(sparse=corrupted))
        d_loss, _ = detection_loss(
            self.discriminator(rep.pooled, rep.field_emb), corrupted != batch.sparse
        )
        g_loss = F.cross_entropy(proposal.logits, torch.zeros_like(proposal.rows))
        return d_loss + self.generator_weight * g_loss


@pytest.mark.parametrize("sample_temperature", [1.0, 0.5])
def test_replaced_feature_detection_equals_its_plain_formulation(
    sample_temperature: float,
    make_backbone,
    make_batch,  # noqa: ANN001
) -> None:
    batch = make_batch(128)
    losses, grads = [], []
    for cls in (ReplacedFeatureDetection, PlainReplacedFeatureDetection):
        torch.manual_seed(0)
        backbone = make_backbone()
        objective = cls(View(RandomFieldMask(0.4), seed=2), num_candidates=32,
                        sample_temperature=sample_temperature)  # fmt: skip
        objective.setup(backbone)
        out = objective(batch, backbone)
        loss = out if isinstance(out, torch.Tensor) else out.loss
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad for n, p in objective.named_parameters() if p.grad is not None})
    assert torch.equal(losses[0], losses[1])  # the same samples, the same loss
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], msg=name)


def test_candidate_mix_equals_the_plain_formulation_with_its_gradient() -> None:
    fields, _, _, (_, target, cand) = _candidate_inputs(3)
    weights0 = torch.randn(fields.shape[0], 1 + cand.shape[0]).softmax(1)
    results = []
    for fused in (True, False):
        weights = weights0.clone().requires_grad_()
        if fused:
            mixed = candidate_mix(weights, fields, target, cand)
        else:
            rest = torch.empty_like(target)
            for f in fields.unique().tolist():
                rows = (fields == f).nonzero().squeeze(1)
                rest = rest.index_put((rows,), weights[rows, 1:] @ cand[:, f])
            mixed = weights[:, :1] * target + rest
        (mixed * torch.linspace(-1, 1, mixed.shape[1])).sum().backward()
        results.append((mixed.detach(), weights.grad))
    for ours, plain in zip(*results, strict=True):
        assert torch.equal(ours, plain)
    empty = candidate_mix(weights0[:0], fields[:0], target[:0], cand)
    assert empty.shape == (0, target.shape[1])


def test_entropy_and_cross_entropy_equal_the_plain_terms_with_their_gradients() -> None:
    g = torch.Generator().manual_seed(4)
    logits0, target = torch.randn(30, 7, generator=g), torch.randint(0, 3, (30,), generator=g)
    logits0[:, 4:] = float("-inf")  # impossible classes
    results = []
    for fused in (True, False):
        logits = logits0.clone().requires_grad_()
        if fused:
            entropy, ce = entropy_and_cross_entropy(logits, target)
        else:
            logp = logits.log_softmax(1)
            entropy = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(1).mean()
            ce = F.cross_entropy(logits, target)
        (0.3 * ce - 0.7 * entropy).backward()
        results.append((entropy.detach(), ce.detach(), logits.grad))
    assert torch.equal(results[0][1], results[1][1])
    for ours, plain in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(ours, plain)
    with torch.no_grad():
        torch.testing.assert_close(entropy_and_cross_entropy(logits0, target)[0], results[0][0])


def plain_mix(self: Proposal, weights: torch.Tensor) -> torch.Tensor:
    """Proposal.mix as per-field products put back in row order."""
    rest = torch.empty_like(self.true_emb)
    for f in self.fields.unique().tolist():
        rows = (self.fields == f).nonzero().squeeze(1)
        rest = rest.index_put((rows,), weights[rows, 1:] @ self.row_emb[:, f])
    return weights[:, :1] * self.true_emb + rest


def plain_entropy_and_mlm_loss(self: Proposal) -> tuple[torch.Tensor, torch.Tensor]:
    """Proposal.entropy_and_mlm_loss as two separately differentiated terms."""
    logp = self.logits.log_softmax(1)
    entropy = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(1).mean()
    return entropy, F.cross_entropy(self.logits, torch.zeros_like(self.rows))


def test_adversarial_generator_loss_equals_its_plain_formulation(
    monkeypatch, make_backbone, make_batch
) -> None:  # noqa: ANN001
    batch = make_batch(128)
    losses, grads, calls = [], [], []
    for plain in (False, True):
        if plain:
            monkeypatch.setattr(Proposal, "mix", lambda *a: calls.append(1) or plain_mix(*a))
            monkeypatch.setattr(Proposal, "entropy_and_mlm_loss", plain_entropy_and_mlm_loss)
        torch.manual_seed(0)
        backbone = make_backbone()
        objective = AdversarialFeatureReplacement(
            View(RandomFieldMask(0.4), seed=2), entropy_weight=0.1, mlm_weight=0.5
        )
        objective.setup(backbone)
        loss = objective.generator_loss(batch, backbone).loss
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad for n, p in objective.generator.named_parameters()})
    assert calls  # the second run used the plain formulation
    torch.testing.assert_close(losses[0], losses[1])
    assert grads[0] and all(g is not None for g in grads[0].values())
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], msg=name)
