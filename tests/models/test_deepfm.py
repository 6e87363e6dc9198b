import torch

from ssl_rec.models import DeepFMEncoder, FMInteraction


def test_fm_interaction_is_the_sum_of_pairwise_dot_products():
    torch.manual_seed(0)
    v = torch.randn(5, 4, 3)
    brute = sum((v[:, f] * v[:, g]).sum(1) for f in range(4) for g in range(f + 1, 4))
    torch.testing.assert_close(FMInteraction()(v).sum(1), brute)


def test_deepfm_pooled_carries_the_fm_term():
    torch.manual_seed(0)
    enc = DeepFMEncoder(n_fields=3, n_dense=0, embedding_dim=4, deep=[8])
    emb = torch.randn(6, 3, 4)
    pooled, dense_emb = enc(emb, torch.zeros(6, 0))
    assert pooled.shape == (6, enc.output_dim) == (6, 4 + 1 + 8) and dense_emb is None
    torch.testing.assert_close(pooled[:, :4], FMInteraction()(emb))
