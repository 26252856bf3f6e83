"""The one device rule (``fastqa.train.distributed.default_device``) and the one thread rule
(``fastqa.tasks.loading.cpu_threads``), as the command line, the predictors and the trainer use them."""
from __future__ import annotations

import pytest
import torch

from fastqa.tasks.flags import resolve_device
from fastqa.tasks.loading import cpu_threads
from fastqa.train.distributed import default_device, init_distributed


def test_the_device_rule_is_the_same_for_the_command_line_the_predictors_and_training(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    here = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert default_device() == here
    assert resolve_device(None) == str(here)
    assert init_distributed(None).device == here
    assert default_device("cpu") == torch.device("cpu") and resolve_device("cpu") == "cpu"


def test_under_torchrun_an_unindexed_cuda_device_is_this_ranks_gpu(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert default_device("cuda") == torch.device("cuda", 3)
    assert default_device("cuda:1") == torch.device("cuda", 1)   # an index given is kept
    assert default_device("cpu") == torch.device("cpu")


def test_the_thread_rule_sets_the_count_and_a_with_block_puts_it_back():
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    try:
        with cpu_threads(other):
            assert torch.get_num_threads() == other
            with cpu_threads(None):                  # None leaves the count as it is
                assert torch.get_num_threads() == other
        assert torch.get_num_threads() == before
        cpu_threads(other)                           # a plain call keeps it (a predictor's load, a server worker)
        assert torch.get_num_threads() == other
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("bad,error", [(0, ValueError), (-2, ValueError), (1.5, TypeError), ("2", TypeError)])
def test_a_bad_thread_count_names_the_argument(bad, error):
    before = torch.get_num_threads()
    with pytest.raises(error, match="threads"):
        cpu_threads(bad)
    assert torch.get_num_threads() == before
