"""masked_ttt_anchored: the adapted prediction only when the held-out MLM loss fell and KL stays in budget."""

from __future__ import annotations

import pytest
import torch
from engine_checks import plain_logits, snapshot, unchanged

from ttt_pipeline.config import TTTConfig
from ttt_pipeline.defenses import registry
from ttt_pipeline.defenses.base import EngineSettings
from ttt_pipeline.defenses.masked_ttt import MaskedTTT
from ttt_pipeline.defenses.masked_ttt_anchored import AnchoredTTT, Settings, kl_divergence
from ttt_pipeline.modeling.model import special_token_ids

# on the tiny random BERT, these settings lower the held-out MLM loss of three reviews and raise the fourth's
SETTINGS = dict(mask_prob=0.5, lr=1e-3, seed=0)


def anchored(tiny_clf, budget):
    model, tok = tiny_clf
    return AnchoredTTT(model, tok.mask_token_id, special_token_ids(tok), EngineSettings(**SETTINGS),
                       Settings(kl_budget=budget))


def test_zero_budget_is_the_source_prediction(tiny_clf, recipe_batch):
    model, _ = tiny_clf
    before = snapshot(model)
    engine = anchored(tiny_clf, 0.0)
    out = engine.predict(*recipe_batch)
    assert torch.allclose(out, plain_logits(model, *recipe_batch), atol=1e-5)
    assert engine.stats["kept"] == 0 and unchanged(model, before)


def test_infinite_budget_keeps_the_adapted_prediction_where_the_loss_fell(tiny_clf, recipe_batch):
    model, tok = tiny_clf
    before = snapshot(model)
    engine = anchored(tiny_clf, float("inf"))
    out = engine.predict(*recipe_batch)
    last = engine.last
    fell = last["loss_after"] < last["loss_before"]
    assert torch.equal(last["keep"], fell) and 0 < int(fell.sum()) < len(fell)  # some kept, some fell back
    ttt = MaskedTTT(model, tok.mask_token_id, special_token_ids(tok), EngineSettings(**SETTINGS)).predict(*recipe_batch)
    source = plain_logits(model, *recipe_batch)
    assert torch.allclose(out[fell], ttt[fell], atol=1e-6)
    assert torch.allclose(out[~fell], source[~fell], atol=1e-5)
    assert not torch.allclose(ttt[fell], source[fell], atol=1e-6)  # the kept rows really are adapted
    assert engine.stats["kept"] == int(fell.sum()) and engine.stats["fallback_loss"] == int((~fell).sum())
    assert unchanged(model, before)


def test_budget_between_splits_on_kl(tiny_clf, recipe_batch):
    probe = anchored(tiny_clf, float("inf"))
    probe.predict(*recipe_batch)
    kl, fell = probe.last["kl"], probe.last["loss_after"] < probe.last["loss_before"]
    budget = float(kl[fell].median())
    engine = anchored(tiny_clf, budget)
    engine.predict(*recipe_batch)
    assert torch.equal(engine.last["keep"], fell & (kl <= budget))
    assert engine.stats["fallback_kl"] == int((fell & (kl > budget)).sum())


def test_held_out_masks_are_not_the_trained_ones_and_registry_reads_the_budget(tiny_clf):
    model, tok = tiny_clf
    cfg = TTTConfig(steps=2, views=3, masked_ttt_anchored={"kl_budget": 0.2})
    engine = registry.build_engine("masked_ttt_anchored", model, tok, cfg)
    assert isinstance(engine, AnchoredTTT) and registry.parse("masked_ttt_anchored").masked
    assert engine.kl_budget == 0.2 and engine.check_draw == 6  # masks 0-5 are the adaptation's
    assert registry.build_engine("masked_ttt_anchored", model, tok, EngineSettings()).kl_budget == 0.005
    with pytest.raises(ValueError, match="kl_budget"):
        TTTConfig(masked_ttt_anchored={"kl_budget": -1.0})


def test_kl_divergence():
    p = torch.tensor([[2.0, 0.0, 0.0]])
    assert float(kl_divergence(p, p)) == pytest.approx(0.0, abs=1e-7)
    q = torch.zeros(1, 3)
    probs = torch.softmax(p, -1)
    expected = (probs * (probs.log() - torch.log(torch.tensor(1 / 3)))).sum()
    assert float(kl_divergence(p, q)) == pytest.approx(float(expected))
