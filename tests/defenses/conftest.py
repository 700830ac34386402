"""Fixtures of the defense tests: a batch of reviews for the tiny classifier (`tiny_clf`, tests/conftest.py)."""

from __future__ import annotations

import pytest
from texts import REVIEWS


@pytest.fixture(scope="module")
def recipe_batch(tiny_clf):
    _, tok = tiny_clf
    enc = tok(REVIEWS, padding=True, truncation=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]
