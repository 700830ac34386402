"""Fixtures of the TTT tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny model's kernels are too small to share: on a busy 2-core machine each 2-thread kernel can
    wait milliseconds for its second thread, so these tests run single-threaded (restored afterwards)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
