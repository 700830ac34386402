"""The small-scale counterfactual machinery of bench/attribution.py (ttt_pipeline.evaluation.attribution_check): the
retraining algorithm is a deterministic function of its training subset, its tail is the model's, and the
removal check and the LDS report what they say on the tiny model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from ttt_pipeline.evaluation.attribution_check import TailTrainer, lds, removal_check

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo" / "reviews.jsonl"


@pytest.fixture(scope="module")
def trainer(tiny_star_clf):
    model, tok = tiny_star_clf
    reviews = pd.read_json(DEMO, lines=True)
    train = reviews.iloc[:40]
    trainer = TailTrainer(model, tok, train["text"].tolist(), (train["rating"] - 1).tolist(),
                          _target_texts(), params="head+last1", max_length=48, epochs=2, lr=1e-2, batch_size=8)
    trainer.tokenizer = tok  # for the checks below
    return trainer


def test_retraining_is_a_function_of_the_subset(trainer):
    everything = np.arange(40)
    a = trainer.target_margins(trainer.train(everything, 0), [0, 1, 2])
    b = trainer.target_margins(trainer.train(everything, 0), [0, 1, 2])
    c = trainer.target_margins(trainer.train(everything[5:], 0), [0, 1, 2])
    d = trainer.target_margins(trainer.train(everything, 1), [0, 1, 2])
    assert np.array_equal(a, b)
    assert not np.allclose(a, c) and not np.allclose(a, d)  # the data and the head seed matter


def test_full_model_carries_the_retrained_tail(trainer):
    from ttt_pipeline.evaluation.attribution import Encoded

    tail = trainer.train(np.arange(40), 0)
    model = trainer.full_model(tail)
    logits = trainer.target_logits(tail)
    for rows, ids, am in Encoded.of(trainer.tokenizer, _target_texts(), 48).batches(8):
        with torch.no_grad():
            assert torch.allclose(model(ids, am), logits[rows], atol=1e-4)
    assert not torch.allclose(trainer.model.head.net[-1].weight, model.head.net[-1].weight)  # a copy: untouched


def _target_texts() -> list[str]:
    return pd.read_json(DEMO, lines=True)["text"].iloc[100:103].tolist()


def test_removal_check_and_lds_report_per_target(trainer):
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(3, 40))
    rem = removal_check(trainer, scores, [0, 1, 2], k=5)
    assert rem["drop_topk"].shape == rem["drop_random"].shape == (3,)
    assert np.isfinite(rem["drop_topk"]).all() and np.isfinite(rem["drop_random"]).all()
    # a removal that removes nothing drops nothing: k=0
    none = removal_check(trainer, scores, [0, 1, 2], k=0)
    assert np.allclose(none["drop_topk"], 0) and np.allclose(none["drop_random"], 0)
    out = lds(trainer, scores, [0, 1, 2], n_subsets=4)
    assert out["n_subsets"] == 4 and len(out["per_target"]) == 3 and -1 <= out["lds"] <= 1
