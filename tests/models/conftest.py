"""Model tests run tiny models: one torch thread, so no op waits on a second core that another process
keeps busy (on a loaded 2-core machine two threads made tiny steps 10-30x slower)."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
