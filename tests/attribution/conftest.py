"""The attribution tests run tiny models: one intra-op thread each (a second thread only waits on a busy
machine, and makes a 32-wide layer 50x slower)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
