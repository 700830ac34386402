"""Fixtures of the defense tests: a tiny random BERT classifier and a batch helper."""

from __future__ import annotations

import pytest
import torch

from ttt_pipeline.modeling.model import ModelMeta, ReviewClassifier, load_pretrained

RECIPE_TEXTS = ["the battery died after two days and support never answered my emails",
                "great little speaker , loud and clear",
                "it works as described . the cable is a bit short but fine for the price overall",
                "terrible"]


@pytest.fixture(scope="module")
def tiny_clf(tiny_bert_dir):
    """(ReviewClassifier with 3 classes over the tiny BERT, tokenizer); engines must hand it back unchanged."""
    torch.manual_seed(0)
    mlm, tok, _ = load_pretrained(str(tiny_bert_dir))
    meta = ModelMeta(str(tiny_bert_dir), 3, ["a", "b", "c"], [16], 0.1, 48, True)
    return ReviewClassifier(mlm, meta).eval(), tok


@pytest.fixture(scope="module")
def recipe_batch(tiny_clf):
    _, tok = tiny_clf
    enc = tok(RECIPE_TEXTS, padding=True, truncation=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]
