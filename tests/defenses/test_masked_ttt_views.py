"""masked_ttt_views: MaskedTTT with 4 masked views per step, everything else from ttt.*."""

from __future__ import annotations

import torch
from engine_checks import snapshot, unchanged

from ttt_pipeline.defenses import registry
from ttt_pipeline.defenses.base import EngineSettings
from ttt_pipeline.defenses.masked_ttt import MaskedTTT
from ttt_pipeline.defenses.masked_ttt_views import VIEWS
from ttt_pipeline.modeling.model import special_token_ids


def test_registered_as_a_masked_engine():
    m = registry.parse("masked_ttt_views")
    assert m.engine == "masked_ttt_views" and m.masked
    assert registry.parse("spell+masked_ttt_views").masked


def test_is_masked_ttt_with_four_views_and_the_other_settings_kept(tiny_clf, recipe_batch):
    model, tok = tiny_clf
    settings = EngineSettings(mask_prob=0.3, lr=1e-3, seed=3, steps=2)
    before = snapshot(model)
    engine = registry.build_engine("masked_ttt_views", model, tok, settings)
    assert isinstance(engine, MaskedTTT) and VIEWS == 4
    assert (engine.s.views, engine.s.mask_prob, engine.s.lr, engine.s.seed, engine.steps) == (4, 0.3, 1e-3, 3, 2)
    out = engine.predict(*recipe_batch)
    assert unchanged(model, before)
    same = MaskedTTT(model, tok.mask_token_id, special_token_ids(tok),
                     EngineSettings(mask_prob=0.3, lr=1e-3, seed=3, steps=2, views=4)).predict(*recipe_batch)
    assert torch.equal(out, same)
    one_view = MaskedTTT(model, tok.mask_token_id, special_token_ids(tok),
                         EngineSettings(mask_prob=0.3, lr=1e-3, seed=3, steps=2)).predict(*recipe_batch)
    assert not torch.allclose(out, one_view, atol=1e-6)  # the views change the step
    assert unchanged(model, before)
