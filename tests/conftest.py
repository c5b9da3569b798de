import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Small batched matmuls: one thread (two on a busy 2-core machine are ~100x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
