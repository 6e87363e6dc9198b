import pytest
import torch

from ssl_rec.models import MLP, CTRHead, DCNv2Encoder, DLRMEncoder, DotInteraction


def test_dot_interaction_matches_explicit_pairs():
    x = torch.randn(3, 4, 5)
    out = DotInteraction(4)(x)
    expected = torch.stack(
        [(x[:, i] * x[:, j]).sum(-1) for i in range(4) for j in range(i + 1, 4)], dim=1
    )
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("n_dense", [0, 3])
def test_dlrm_encoder_shapes(n_dense):
    enc = DLRMEncoder(n_fields=5, n_dense=n_dense, embedding_dim=8, bottom=[16], top=[32, 12])
    pooled, dense_emb = enc(torch.randn(7, 5, 8), torch.randn(7, n_dense))
    assert pooled.shape == (7, 12) and enc.output_dim == 12
    assert (dense_emb is None) == (n_dense == 0)
    if dense_emb is not None:
        assert dense_emb.shape == (7, 8)


def test_dcnv2_encoder_shapes_and_cross_identity():
    enc = DCNv2Encoder(
        n_fields=4, n_dense=2, embedding_dim=3, cross_layers=2, low_rank=4, deep=[10]
    )
    pooled, dense_emb = enc(torch.randn(6, 4, 3), torch.randn(6, 2))
    assert pooled.shape == (6, 10) and dense_emb is None
    layer = enc.cross[0]
    x0 = torch.randn(2, 14)
    with torch.no_grad():
        for p in layer.parameters():
            p.zero_()
    torch.testing.assert_close(layer(x0, x0), x0)


def test_bad_widths_raise():
    with pytest.raises(ValueError, match="positive"):
        MLP(0, [3])
    with pytest.raises(ValueError, match="dropout"):
        MLP(2, [3], dropout=1.0)
    with pytest.raises(ValueError, match="top"):
        DLRMEncoder(3, 2, 4, top=[])
    with pytest.raises(ValueError, match="cross_layers"):
        DCNv2Encoder(3, 2, 4, cross_layers=0)


def test_ctr_head_is_linear_by_default():
    head = CTRHead(6)
    assert head(torch.randn(5, 6)).shape == (5,)
    assert sum(isinstance(m, torch.nn.Linear) for m in head.modules()) == 1
