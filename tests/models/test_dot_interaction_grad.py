"""DLRM's dot interaction in training: the module's own forward values and the exact gradient
of the Gram matrix's upper triangle, from its one-product backward."""

from __future__ import annotations

import torch

from ssl_rec.models import DotInteraction


def _plain(vectors: torch.Tensor) -> torch.Tensor:
    n = vectors.shape[1]
    rows, cols = torch.triu_indices(n, n, offset=1)
    return torch.bmm(vectors, vectors.transpose(1, 2))[:, rows, cols]


def test_training_forward_equals_the_no_grad_forward_and_the_plain_formula() -> None:
    layer = DotInteraction(7)
    vectors = torch.randn(33, 7, 5, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        served = layer(vectors)
    trained = layer(vectors.clone().requires_grad_())
    assert trained.requires_grad
    assert torch.equal(trained.detach(), served)
    assert torch.equal(served, _plain(vectors))


def test_backward_matches_autograd_of_the_plain_formula() -> None:
    gen = torch.Generator().manual_seed(1)
    vectors, grad = torch.randn(64, 9, 16, generator=gen), torch.randn(64, 36, generator=gen)
    ours, theirs = vectors.clone().requires_grad_(), vectors.clone().requires_grad_()
    DotInteraction(9)(ours).backward(grad)
    _plain(theirs).backward(grad)
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-5)


def test_gradcheck_in_double_precision() -> None:
    layer = DotInteraction(4).double()
    vectors = torch.randn(3, 4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (vectors,))


def test_bfloat16_autocast_gives_an_input_dtype_gradient() -> None:
    layer = DotInteraction(5)
    vectors = torch.randn(8, 5, 4, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(vectors)
    out.float().sum().backward()
    assert vectors.grad.dtype == torch.float32
    expected = torch.autograd.grad(_plain(vectors).sum(), vectors)[0]
    torch.testing.assert_close(vectors.grad, expected, rtol=0.05, atol=0.05)
