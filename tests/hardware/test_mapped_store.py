import pytest
import torch

from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec


def _train(emb, steps=20):
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(0, 300, (64, 2), generator=gen)
        out = emb(ids)
        (out - 1.0).pow(2).sum().backward()


def _mapped(tensor, directory):
    with open("/proc/self/maps") as f:
        maps = f.read()
    return f"{directory}/.table" in maps and "(deleted)" in maps


def test_memory_mapped_store_trains_like_ram(tmp_path):
    ram_spec = TableSpec("int8", cache_fraction=0.1)
    disk_spec = TableSpec("int8", cache_fraction=0.1, store_dir=str(tmp_path))
    ram = MixedPrecisionEmbeddingCollection([500, 300], 8, ram_spec, seed=1)
    disk = MixedPrecisionEmbeddingCollection([500, 300], 8, disk_spec, seed=1)
    assert _mapped(disk.group.tables[0].store, tmp_path)
    assert not list(tmp_path.iterdir())  # the files are unlinked once mapped
    _train(ram)
    _train(disk)
    for a, b in zip(ram.float_weights(), disk.float_weights(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    copy = MixedPrecisionEmbeddingCollection([500, 300], 8, ram_spec, seed=2)
    copy.load_state_dict(disk.state_dict())  # export / checkpoint: same state as in RAM
    torch.testing.assert_close(copy.float_weights()[0], disk.float_weights()[0], rtol=0, atol=0)


def test_store_dir_must_exist(tmp_path):
    spec = TableSpec("int8", store_dir=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="store_dir .* is not an existing directory"):
        MixedPrecisionEmbeddingCollection([10], 8, spec)
    with pytest.raises(ValueError, match="TableSpec.store_dir must be a directory path"):
        TableSpec("int8", store_dir="")
