"""masked_ttt_lower_norm: only LayerNorm and bias parameters of the lower half of the encoder move."""

from __future__ import annotations

import pytest
from engine_checks import snapshot, unchanged

from ttt_pipeline.defenses import registry
from ttt_pipeline.defenses.base import EngineSettings
from ttt_pipeline.defenses.masked_ttt_lower_norm import LR_SCALE
from ttt_pipeline.defenses.params import lower_norm_parameters, select_parameters


def names_of(model, params) -> set[str]:
    ids = {id(p) for p in params}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_selection_is_lower_layers_norms_and_biases(tiny_clf):
    model, _ = tiny_clf
    names = names_of(model, lower_norm_parameters(model))
    assert names and names == names_of(model, select_parameters(model, "lower_norm"))
    assert any("embeddings.LayerNorm" in n for n in names)
    assert all(".layer.0." in n or "embeddings.LayerNorm" in n for n in names), names  # 2 layers: the lower one
    assert all(n.endswith("bias") or "LayerNorm" in n for n in names), names
    assert not any(n.startswith("head.") for n in names)
    assert names_of(model, lower_norm_parameters(model, 2)) > names  # lower_k = both layers adds layer 1's
    with pytest.raises(ValueError, match="lower_k"):
        lower_norm_parameters(model, 3)


def test_adapts_only_those_parameters_then_restores(tiny_clf, recipe_batch):
    model, tok = tiny_clf
    before = snapshot(model)
    engine = registry.build_engine("masked_ttt_lower_norm", model, tok, EngineSettings(mask_prob=0.3, lr=1e-3))
    assert registry.parse("masked_ttt_lower_norm").masked
    assert engine.s.params == "lower_norm" and engine.s.lr == pytest.approx(1e-3 * LR_SCALE)
    allowed = names_of(model, lower_norm_parameters(model))
    assert names_of(model, engine.params) == allowed
    engine.adapt(*recipe_batch)
    moved = {n for n, p in model.named_parameters() if any(p is engine.params[i] for i in engine.flat.changed())}
    assert moved and moved <= allowed
    engine.reset()
    engine.predict(*recipe_batch)
    assert unchanged(model, before)
