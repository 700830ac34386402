"""Fixtures of the defense tests: one torch thread, a batch of reviews for the tiny classifier (`tiny_clf`, tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch
from texts import REVIEWS


@pytest.fixture(scope="module")
def one_thread():
    """Tiny kernels on a busy 2-core machine: one thread is faster (see tests/ttt/conftest.py). A module opts in
    with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def recipe_batch(tiny_clf):
    _, tok = tiny_clf
    enc = tok(REVIEWS, padding=True, truncation=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]
