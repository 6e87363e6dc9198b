"""Fixtures shared by the hardware tests."""

import pytest
import torch


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    """Run the test with 1 and with 2 intra-op threads (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)
