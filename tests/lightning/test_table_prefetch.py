"""The modules admit the next batch's table rows during the current step, with no user code,
and the helper thread changes no result."""

from __future__ import annotations

from functools import partial

import pytorch_lightning as pl
import torch

from ssl_rec.hardware import TableSpec
from ssl_rec.lightning import CTRModule
from ssl_rec.lightning.table_prefetch import TablePrefetch
from ssl_rec.models import Backbone, DLRMEncoder
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch

CARDS = (6, 300, 2000)


def _module() -> CTRModule:
    fields = tuple(CategoricalField(f"C{i + 1}", c) for i, c in enumerate(CARDS))
    schema = FeatureSchema(("I1",), fields, "label").to_dict()
    encoder = partial(DLRMEncoder, bottom=(8,), top=(16,))
    tables = TableSpec("int8", 0.05)
    torch.manual_seed(0)
    return CTRModule(partial(Backbone, embedding_dim=8, tables=tables, encoder=encoder), schema)


def _batches(n: int = 6, size: int = 64) -> list[Batch]:
    g = torch.Generator().manual_seed(0)
    return [
        Batch(
            torch.randn(size, 1, generator=g),
            torch.stack([torch.randint(0, c, (size,), generator=g) for c in CARDS], 1),
            torch.randint(0, 2, (size,), generator=g).float(),
        )
        for _ in range(n)
    ]


def _fit(tmp_path, background: bool) -> CTRModule:
    module = _module()
    module.configure_callbacks = lambda: [TablePrefetch(background)]
    trainer = pl.Trainer(max_epochs=2, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False,
                         default_root_dir=tmp_path, accelerator="cpu")  # fmt: skip
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(_batches(), batch_size=None))
    return module


def test_prefetch_callback_thread_changes_nothing(tmp_path):
    inline, overlapped = _fit(tmp_path, False), _fit(tmp_path, True)
    stats = overlapped.backbone.table_stats()["cache"]
    assert stats["prefetch_used"] == 10 and stats["prefetch_discarded"] == 0  # 5 per epoch
    theirs = overlapped.state_dict()
    for key, x in inline.state_dict().items():
        y = theirs[key]
        assert torch.equal(x, y) if torch.is_tensor(x) else x == y, key
