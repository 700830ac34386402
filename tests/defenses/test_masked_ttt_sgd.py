"""masked_ttt_sgd: 3 steps of SGD with momentum 0.9 at ttt.lr x LR_SCALE; momentum restarts every unit."""

from __future__ import annotations

import pytest
import torch
from engine_checks import snapshot, unchanged

from ttt_pipeline.defenses import registry
from ttt_pipeline.defenses.base import EngineSettings
from ttt_pipeline.defenses.masked_ttt import MaskedTTT
from ttt_pipeline.defenses.masked_ttt_sgd import LR_SCALE, MOMENTUM, STEPS, MomentumSGDTTT, rms_update
from ttt_pipeline.modeling.model import special_token_ids


def test_registered_as_a_masked_engine():
    assert registry.parse("masked_ttt_sgd").masked


def test_sgd_with_momentum_three_steps_weights_restored(tiny_clf, recipe_batch):
    model, tok = tiny_clf
    before = snapshot(model)
    engine = registry.build_engine("masked_ttt_sgd", model, tok, EngineSettings(mask_prob=0.3, lr=1e-5))
    assert isinstance(engine, MomentumSGDTTT) and (STEPS, MOMENTUM) == (3, 0.9)
    assert isinstance(engine.opt, torch.optim.SGD) and engine.steps == 3
    group = engine.opt.param_groups[0]
    assert group["momentum"] == 0.9 and group["lr"] == pytest.approx(1e-5 * LR_SCALE)
    first = engine.predict(*recipe_batch)
    assert engine.stats["steps"] == 3 and unchanged(model, before)
    # a second unit starts from the source weights and a zero momentum: the same result
    assert torch.equal(engine.predict(*recipe_batch), first)
    fresh = registry.build_engine("masked_ttt_sgd", model, tok, EngineSettings(mask_prob=0.3, lr=1e-5))
    assert torch.equal(fresh.predict(*recipe_batch), first)
    assert unchanged(model, before)


def test_momentum_changes_the_later_steps(tiny_clf, recipe_batch):
    model, tok = tiny_clf
    settings = EngineSettings(mask_prob=0.3, lr=1e-2, steps=3, optimizer="sgd")
    with_momentum = MomentumSGDTTT(model, tok.mask_token_id, special_token_ids(tok), settings).predict(*recipe_batch)
    plain_sgd = MaskedTTT(model, tok.mask_token_id, special_token_ids(tok), settings).predict(*recipe_batch)
    assert not torch.allclose(with_momentum, plain_sgd, atol=1e-7)
    one_step = EngineSettings(mask_prob=0.3, lr=1e-2, steps=1, optimizer="sgd")  # step 1: momentum has nothing yet
    a = MomentumSGDTTT(model, tok.mask_token_id, special_token_ids(tok), one_step).predict(*recipe_batch)
    b = MaskedTTT(model, tok.mask_token_id, special_token_ids(tok), one_step).predict(*recipe_batch)
    assert torch.allclose(a, b, atol=1e-6)


def test_rms_update_measures_the_move_and_restores(tiny_clf, recipe_batch):
    model, tok = tiny_clf
    before = snapshot(model)
    small = rms_update(registry.build_engine("masked_ttt_sgd", model, tok, EngineSettings(mask_prob=0.3, lr=1e-6)),
                       *recipe_batch)
    large = rms_update(registry.build_engine("masked_ttt_sgd", model, tok, EngineSettings(mask_prob=0.3, lr=1e-5)),
                       *recipe_batch)
    assert 0 < small < large and large == pytest.approx(10 * small, rel=0.05)  # SGD: the move is linear in lr
    assert unchanged(model, before)
