"""Issue 35: the self-supervised signal, measured. The MLM head's quality on a set's text, and masked TTT's
held-out MLM loss before and after adapting, on masks it never stepped on, without changing a prediction."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from texts import REVIEWS

from ttt_pipeline.defenses.base import EngineSettings
from ttt_pipeline.defenses.masked_ttt import HELDOUT_DRAW, MaskedTTT
from ttt_pipeline.evaluation.signal import changed_share, heldout_fields, mlm_quality, signal_headline
from ttt_pipeline.modeling.model import special_token_ids

TEXTS = [REVIEWS[0], REVIEWS[1], REVIEWS[3]]


def _engine(tiny_clf, **kw):
    model, tok = tiny_clf
    return MaskedTTT(model, tok.mask_token_id, special_token_ids(tok), EngineSettings(precision="fp32", **kw))


def test_mlm_quality_is_a_deterministic_perplexity_on_the_sets_own_text(tiny_clf):
    model, tok = tiny_clf
    texts = TEXTS * 4
    q = mlm_quality(model, tok, texts, 48, 4, "cpu", seed=0)
    assert q == mlm_quality(model, tok, texts, 48, 5, "cpu", seed=0)  # row-hash masks: batch size plays no part
    assert q["mlm_perplexity"] == pytest.approx(math.exp(q["mlm_loss"]))
    # a random head over a 30k vocabulary: near uniform, and almost never right
    assert math.log(tok.vocab_size) - 1.5 < q["mlm_loss"] < math.log(tok.vocab_size) + 1.5
    assert 0.0 <= q["mlm_top1"] <= 0.2 and q["mlm_tokens"] > 0
    assert mlm_quality(model, tok, texts, 48, 4, "cpu", seed=0, limit=2)["mlm_tokens"] < q["mlm_tokens"]
    assert mlm_quality(model, tok, texts, 48, 4, "cpu", limit=0) is None


def test_probes_leave_predictions_alone_and_record_one_pair_per_measured_batch(tiny_clf, recipe_batch):
    ids, am = recipe_batch
    model = tiny_clf[0]
    before = [p.detach().clone() for p in model.parameters()]
    plain = _engine(tiny_clf, steps=2, lr=1e-3).predict(ids, am)
    probed = _engine(tiny_clf, steps=2, lr=1e-3, signal_every=1)
    logits = probed.predict(ids, am)
    assert torch.equal(plain, logits)
    probed.predict(ids, am)
    assert len(probed.stats["heldout"]) == 2
    every_other = _engine(tiny_clf, steps=2, lr=1e-3, signal_every=2)
    for _ in range(3):
        every_other.predict(ids, am)
    assert len(every_other.stats["heldout"]) == 2  # units 1 and 3
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # restored after each unit


def test_heldout_masks_are_never_stepped_on(tiny_clf, recipe_batch):
    ids, am = recipe_batch
    engine = _engine(tiny_clf, steps=3, views=2, mask_prob=0.3)
    held = engine.probe(ids, am)["mask"]
    for step in range(3):
        for v in range(2):
            assert not bool((held & engine.mask_fn(ids, am, step * 2 + v).bool()).any())
    assert bool(held.any()) and HELDOUT_DRAW < 0


def test_adaptation_moves_the_heldout_loss_only_when_it_learns(tiny_clf, recipe_batch):
    ids, am = recipe_batch
    still = _engine(tiny_clf, steps=1, lr=1e-12, signal_every=1)
    still.predict(ids, am)
    (b0, a0), = still.stats["heldout"]
    assert a0 == pytest.approx(b0, abs=1e-5)
    learns = _engine(tiny_clf, steps=5, lr=3e-3, signal_every=1)
    learns.predict(ids, am)
    (b1, a1), = learns.stats["heldout"]
    assert a1 < b1 - 0.05, (b1, a1)  # learning the unit's own text lowers the loss on its unseen masks
    row = heldout_fields(learns.stats)
    assert row["heldout_units"] == 1 and row["heldout_before"] == pytest.approx(b1)
    assert heldout_fields({"heldout": []}) == {}


def test_signal_headline_and_changed_share():
    rows = [{"kind": "clean", "set": "clean", "method": "none", "family": None, "mlm_loss": 2.0,
             "mlm_perplexity": math.exp(2.0), "mlm_top1": 0.4},
            {"kind": "corrupted", "set": "k-3", "method": "none", "family": "keyboard", "mlm_loss": 3.0,
             "mlm_perplexity": math.exp(3.0), "mlm_top1": 0.3},
            {"kind": "corrupted", "set": "e-3", "method": "none", "family": "ext:ocr", "mlm_loss": 9.0,
             "mlm_perplexity": math.exp(9.0), "mlm_top1": 0.0},
            {"kind": "corrupted", "set": "k-3", "method": "masked_ttt", "family": "keyboard", "mask_seed": 0,
             "heldout_before": 3.0, "heldout_after": 2.5},
            {"kind": "corrupted", "set": "k-3", "method": "masked_ttt", "family": "keyboard", "mask_seed": 1,
             "heldout_before": 3.2, "heldout_after": 2.9}]
    preds = pd.DataFrame({"kind": ["corrupted"] * 6, "set": ["k-3"] * 6, "index": [0, 1, 0, 1, 0, 1],
                          "method": ["none", "none", "masked_ttt", "masked_ttt", "masked_ttt", "masked_ttt"],
                          "pred": [1, 2, 1, 0, 1, 2]})
    h = signal_headline(rows, preds)
    assert h["mlm_perplexity_clean"] == pytest.approx(math.exp(2.0)) and h["mlm_top1_clean"] == 0.4
    assert h["mlm_loss_corrupted"] == 3.0  # the own suite only: the ext: set stays apart
    assert h["ttt_heldout_before"] == pytest.approx(3.1) and h["ttt_heldout_change"] == pytest.approx(-0.4)
    assert h["ttt_changed_share"] == pytest.approx(0.25) == changed_share(preds, "masked_ttt")
    assert signal_headline([]) == {}
