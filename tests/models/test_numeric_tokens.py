"""Dense columns embedded as tokens (quantile / periodic), masked and predicted like ids."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from ssl_rec.cli import main
from ssl_rec.data import CriteoDataModule, SyntheticClickModel, SyntheticConfig, write_criteo_tsv
from ssl_rec.lightning import CTRModule
from ssl_rec.lightning.checkpoint_loading import load_module
from ssl_rec.models import Backbone, DCNv2Encoder, DeepFMEncoder, DLRMEncoder, TowerEncoder
from ssl_rec.models.numeric_tokens import piecewise_linear_encoding, quantile_bin_ids
from ssl_rec.objectives import MaskedFeaturePrediction, MomentumContrast
from ssl_rec.quantize.model import FloatCTR
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch
from ssl_rec.views import RandomFieldMask, View
from ssl_rec.vocab import DENSE_STATISTICS_KEY, DenseStatistics

KINDS = ("quantile_tokens", "periodic_tokens")
ENCODERS = {
    "dlrm": DLRMEncoder,
    "dcnv2": DCNv2Encoder,
    "deepfm": DeepFMEncoder,
    "tower": partial(TowerEncoder, output_dim=8),
}


def _statistics(values: np.ndarray, bins: int = 8) -> DenseStatistics:
    edges = np.quantile(values, np.linspace(0, 1, bins + 1), axis=0).T
    columns = tuple(f"x{i}" for i in range(values.shape[1]))
    return DenseStatistics(columns, values.mean(0), values.std(0), edges, len(values))


def _schema(values: np.ndarray, bins: int = 8) -> FeatureSchema:
    fields = [CategoricalField("user", 8), CategoricalField("item", 2000)]
    columns = [f"x{i}" for i in range(values.shape[1])]
    stats = _statistics(values, bins).to_dict()
    return FeatureSchema(columns, fields, "label", {DENSE_STATISTICS_KEY: stats})


def _rows(n: int, seed: int = 0) -> tuple[np.ndarray, torch.Tensor]:
    """Two gamma columns; column 0 is (noisily) a function of the user id."""
    rng = np.random.default_rng(seed)
    user = rng.integers(1, 8, n)
    dense = np.stack([user * 3.0 + rng.normal(0, 0.3, n), rng.gamma(2.0, 3.0, n)], 1)
    sparse = torch.from_numpy(np.stack([user, rng.integers(1, 2000, n)], 1))
    return dense, sparse


def test_piecewise_linear_encoding_and_bins_follow_the_edges() -> None:
    edges = torch.tensor([[0.0, 1.0, 1.0, 3.0]])  # a repeated edge: a frequent value 1.0
    x = torch.tensor([[-5.0], [0.5], [1.0], [2.0], [9.0]])
    ple = piecewise_linear_encoding(x, edges)
    want = torch.tensor(
        [[0.0, 0.0, 0.0], [0.5, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.5], [1.0, 1.0, 1.0]]
    )
    torch.testing.assert_close(ple.squeeze(1), want)
    assert quantile_bin_ids(x, edges).squeeze(1).tolist() == [0, 0, 2, 2, 2]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_every_encoder_sees_the_numeric_tokens(kind: str, name: str) -> None:
    dense, sparse = _rows(64)
    backbone = Backbone(_schema(dense), embedding_dim=8, encoder=ENCODERS[name],
                        dense_encoding=kind)  # fmt: skip
    dims = backbone.dims
    assert (dims.n_fields, dims.n_dense, dims.n_numeric_tokens, dims.n_tokens) == (2, 2, 2, 4)
    assert dims.numeric_bins == 8
    batch = Batch(torch.tensor(dense, dtype=torch.float32), sparse)
    rep = backbone(batch)
    assert rep.field_emb.shape == (64, 2, 8) and rep.numeric_emb.shape == (64, 2, 8)
    assert rep.pooled.shape == (64, dims.output_dim)
    rep.pooled.square().sum().backward()
    assert backbone.numeric_tokens.weight.grad.abs().sum() > 0
    # The encoder reads the column: another value of x1 changes the pooled vector ...
    other = batch.with_features(dense=batch.dense + torch.tensor([0.0, 5.0]))
    with torch.no_grad():
        assert not torch.allclose(backbone(other).pooled, backbone(batch).pooled)
        # ... unless its token is masked, then the value is invisible.
        mask = torch.zeros(64, 4, dtype=torch.bool)
        mask[:, 3] = True
        torch.testing.assert_close(backbone(other, mask).pooled, backbone(batch, mask).pooled)


def test_tokens_use_the_training_quantiles_and_survive_the_state_dict() -> None:
    dense, sparse = _rows(400)
    schema = _schema(dense)
    backbone = Backbone(schema, embedding_dim=8, dense_encoding="quantile_tokens").eval()
    batch = Batch(torch.tensor(dense, dtype=torch.float32), sparse)
    bins = backbone.dense_bins(batch.dense)
    counts = torch.stack([torch.bincount(bins[:, c], minlength=8) for c in range(2)])
    assert counts.min() >= 35 and counts.max() <= 65  # quantile bins: ~50 training rows each
    # A model built on other data's statistics takes the trained ones from the state dict.
    other = {DENSE_STATISTICS_KEY: _statistics(dense[:10] * 7).to_dict()}
    other_schema = FeatureSchema(schema.dense, schema.categorical, "label", other)
    fresh = Backbone(other_schema, embedding_dim=8, dense_encoding="quantile_tokens").eval()
    assert not torch.equal(fresh.dense_bins(batch.dense), bins)
    fresh.load_weights(backbone.state_dict())
    torch.testing.assert_close(fresh.dense_bins(batch.dense), bins)
    torch.testing.assert_close(fresh(batch).pooled, backbone(batch).pooled)


class _HideFirstColumn(torch.nn.Module):
    """A masker hiding the first numeric token (column ``F``) of every row, nothing else."""

    def forward(self, ids: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
        mask = torch.zeros_like(ids, dtype=torch.bool)
        mask[:, 2] = True
        return mask


def test_masked_feature_prediction_learns_the_masked_columns_bin() -> None:
    torch.manual_seed(0)
    dense, sparse = _rows(256)
    sparse[:, 1] = sparse[:, 1] % 50  # a small item field keeps the step cheap
    backbone = Backbone(_schema(dense), embedding_dim=8, dense_encoding="quantile_tokens")
    objective = MaskedFeaturePrediction(View(_HideFirstColumn()), hidden=32)
    objective.setup(backbone)
    batch = Batch(torch.tensor(dense, dtype=torch.float32), sparse)
    optimizer = torch.optim.Adam([*backbone.parameters(), *objective.parameters()], lr=0.02)
    first = objective(batch, backbone)
    for _ in range(40):
        optimizer.zero_grad()
        out = objective(batch, backbone)
        out.loss.backward()
        optimizer.step()
    # Column 0 is a function of the (visible) user, its value hidden: chance is 1/8.
    assert float(first.logs["numeric_accuracy"]) < 0.3
    assert float(out.logs["numeric_accuracy"]) > 0.6
    assert float(out.loss.detach()) < float(first.loss.detach()) - 1.0
    plain = Backbone(_schema(dense), embedding_dim=8)  # standardized columns: ids only
    objective = MaskedFeaturePrediction(View(RandomFieldMask(0.5)))
    objective.setup(plain)
    assert "numeric_accuracy" not in objective(batch, plain).logs


def test_a_view_masks_numeric_tokens_only_when_asked() -> None:
    dense, sparse = _rows(256)
    backbone = Backbone(_schema(dense), embedding_dim=8, dense_encoding="periodic_tokens")
    batch = Batch(torch.tensor(dense, dtype=torch.float32), sparse)
    out = View(RandomFieldMask(0.5), embedding_dropout=0.1)(batch, backbone)
    assert out.field_mask.shape == (256, 2) and out.numeric_mask.shape == (256, 2)
    assert 0.35 < out.numeric_mask.float().mean() < 0.65
    off = View(RandomFieldMask(0.5), mask_numeric=False)(batch, backbone)
    assert not off.numeric_mask.any()


def test_momentum_contrast_copies_the_tokenizer_with_the_encoder() -> None:
    dense, sparse = _rows(64)
    backbone = Backbone(_schema(dense), embedding_dim=8, dense_encoding="quantile_tokens")
    objective = MomentumContrast(queue_size=128)
    objective.setup(backbone)
    batch = Batch(torch.tensor(dense, dtype=torch.float32), sparse)
    objective(batch, backbone).loss.backward()
    with torch.no_grad():
        backbone.numeric_tokens.weight.add_(1.0)
    objective(batch, backbone)  # the momentum update moves the key tokenizer too
    key = objective.key_encoder.tokenizer.weight
    assert not torch.allclose(key, backbone.numeric_tokens.weight)
    assert (key - (backbone.numeric_tokens.weight - 1.0)).abs().max() > 1e-4


def test_quantizing_a_model_with_numeric_tokens_is_refused_naming_the_option() -> None:
    dense, _ = _rows(64)
    module = CTRModule(partial(Backbone, embedding_dim=8, dense_encoding="quantile_tokens"),
                       _schema(dense).to_dict())  # fmt: skip
    with pytest.raises(ValueError, match="dense_encoding='quantile_tokens'.*standardize"):
        FloatCTR.from_backbone(module.backbone, module.head)


def test_criteo_counts_get_statistics_and_tokens(tmp_path: Path) -> None:
    rows = SyntheticClickModel(SyntheticConfig(seed=3)).rows("train", 0, 600)
    path = write_criteo_tsv(tmp_path / "train.txt", rows)
    data = CriteoDataModule(str(path), batch_size=128, cache_dir=str(tmp_path / "cache"))
    stats = data.dense_statistics
    assert stats.columns == tuple(f"I{i}" for i in range(1, 14)) and stats.bins == 32
    backbone = Backbone(data.schema, embedding_dim=4, dense_encoding="quantile_tokens")
    assert backbone.dims.n_tokens == 26 + 13
    batch = next(iter(data.train_dataloader()))
    bins = backbone.dense_bins(batch.dense)
    assert bins.shape == (128, 13) and int(bins.max()) <= 31
    assert backbone(batch).pooled.isfinite().all()


def test_the_command_line_trains_tokens_and_quantize_refuses_them(tmp_path, capsys) -> None:
    rng = np.random.default_rng(0)
    lines = ["clicked,price,views,user,item"]
    for _ in range(600):
        user = rng.integers(0, 20)
        lines.append(f"{int(rng.random() < 0.3 + 0.02 * user)},{rng.gamma(2, 3):.2f},"
                     f"{rng.integers(0, 1000)},u{user},i{rng.integers(0, 30)}")  # fmt: skip
    (tmp_path / "clicks.csv").write_text("\n".join(lines) + "\n")
    run = tmp_path / "run"
    main(["fit", "--config", "configs/ctr/tabular.yaml",
          "--data.path", str(tmp_path / "clicks.csv"),
          "--data.label", "clicked", "--data.dense", "[price,views]",
          "--data.categorical", "[user,item]", "--data.batch_size", "128",
          "--trainer.max_epochs", "1", "--trainer.default_root_dir", str(run),
          "--trainer.logger=false", "--trainer.enable_progress_bar=false",
          "--model.backbone.init_args.dense_encoding", "quantile_tokens"])  # fmt: skip
    ckpt = run / "checkpoints" / "last.ckpt"
    module = load_module(ckpt)
    assert module.backbone.dims.n_numeric_tokens == 2
    assert module.backbone.numeric_encoding == "quantile_tokens"
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["quantize", "--ckpt_path", str(ckpt), "--out", str(tmp_path / "q")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "dense_encoding='quantile_tokens'" in err.splitlines()[-1]
