"""tent_filtered: Tent on reliable (low-entropy) reviews only, with SAR's reset; LayerNorm parameters only."""

from __future__ import annotations

import math

import pytest
import torch
from engine_checks import plain_logits, snapshot, unchanged

from ttt_pipeline.config import TTTConfig
from ttt_pipeline.defenses import registry
from ttt_pipeline.defenses.base import EngineSettings
from ttt_pipeline.defenses.params import layernorm_parameters
from ttt_pipeline.defenses.tent import Settings, TentEngine
from ttt_pipeline.defenses.tent_filtered import MARGIN, RESET_FRACTION, FilteredTent, entropy

SETTINGS, TENT = EngineSettings(), Settings(lr=1e-2)


def test_default_thresholds_are_eatas_margin_and_sars_reset(tiny_clf):
    model, tok = tiny_clf
    engine = registry.build_engine("tent_filtered", model, tok, SETTINGS)
    assert isinstance(engine, FilteredTent) and not registry.parse("tent_filtered").masked
    margin, reset = engine.thresholds(4)
    assert margin == pytest.approx(0.4 * math.log(4)) and MARGIN == 0.4
    assert reset == pytest.approx(0.2 / math.log(1000) * math.log(4)) and RESET_FRACTION * math.log(1000) == 0.2
    assert {id(p) for p in engine.params} == {id(p) for p in layernorm_parameters(model)}
    # Tent's section `ttt.tent` is this recipe's too (one Settings class, one section)
    cfg = TTTConfig(tent={"lr": 1e-2, "steps": 2})
    engine = registry.build_engine("tent_filtered", model, tok, cfg)
    assert engine.opt.param_groups[0]["lr"] == 1e-2 and engine.steps == 2
    assert "tent_filtered" not in registry.settings_types() and registry.settings_types()["tent"] is Settings


def test_threshold_zero_adapts_nothing(tiny_clf, recipe_batch):
    model, _ = tiny_clf
    before = snapshot(model)
    engine = FilteredTent(model, SETTINGS, TENT, margin=0.0)
    out = engine.predict(*recipe_batch)
    assert torch.allclose(out, plain_logits(model, *recipe_batch), atol=1e-6)
    assert engine.stats["steps"] == 0 and engine.stats["filtered_rows"] == 4 and engine.stats["reliable_rows"] == 0
    assert unchanged(model, before)


def test_no_filter_and_no_reset_is_tent(tiny_clf, recipe_batch):
    model, _ = tiny_clf
    before = snapshot(model)
    out = FilteredTent(model, SETTINGS, TENT, margin=float("inf"), reset_below=0.0).predict(*recipe_batch)
    tent = TentEngine(model, SETTINGS, TENT).predict(*recipe_batch)
    assert torch.allclose(out, tent, atol=1e-6) and not torch.allclose(out, plain_logits(model, *recipe_batch),
                                                                       atol=1e-6)
    assert unchanged(model, before)


def test_high_entropy_reviews_do_not_move_the_weights(tiny_clf, recipe_batch):
    """The step on the whole batch equals Tent's step on its reliable reviews alone (Adam: the loss's scale,
    sum over reliable / batch size against their mean, does not change the step but through its epsilon)."""
    model, _ = tiny_clf
    ids, am = recipe_batch
    ent = entropy(plain_logits(model, ids, am))
    margin = float(ent.median())
    reliable = ent < margin
    assert 0 < int(reliable.sum()) < len(ent)
    filtered = FilteredTent(model, SETTINGS, TENT, margin=margin, reset_below=0.0)
    filtered._reliable = None
    filtered.adapt(ids, am)
    moved = [f.data.clone() for f in filtered.flat.flat]
    assert torch.equal(filtered._reliable, reliable)
    filtered.reset()
    tent = TentEngine(model, SETTINGS, TENT)
    tent.adapt(ids[reliable], am[reliable])
    expected = [f.data.clone() for f in tent.flat.flat]
    tent.reset()
    step = max(float((a - s).abs().max()) for a, s in zip(moved, filtered.flat.source_values()))
    assert step == pytest.approx(TENT.lr, rel=1e-3)  # Adam's first step: about lr per weight
    # equal up to Adam's epsilon on the tiniest gradients: within 0.1% of the step
    assert all(torch.allclose(a, b, atol=1e-3 * step, rtol=0) for a, b in zip(moved, expected))
    assert filtered.stats["filtered_rows"] == int((~reliable).sum())


def test_collapse_resets_to_the_source_prediction(tiny_clf, recipe_batch):
    model, _ = tiny_clf
    before = snapshot(model)
    engine = FilteredTent(model, SETTINGS, TENT, margin=float("inf"), reset_below=float("inf"))
    out = engine.predict(*recipe_batch)
    assert engine.stats["resets"] == 1 and engine.stats["steps"] == 1 and engine.ema is None
    assert "collapsed" in engine.reset_reasons[0]
    assert torch.allclose(out, plain_logits(model, *recipe_batch), atol=1e-6)
    assert unchanged(model, before)
    quiet = FilteredTent(model, SETTINGS, TENT, margin=float("inf"), reset_below=0.0)
    quiet.predict(*recipe_batch)
    first = quiet.ema
    quiet.predict(*recipe_batch)
    assert quiet.stats["resets"] == 0 and quiet.ema == pytest.approx(first)  # EMA of a constant stays put
