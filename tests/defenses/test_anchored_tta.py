"""anchored_tta: consistency with masked views on confident reviews plus a KL anchor to the frozen model, on the
encoder's LayerNorm/bias parameters, episodic; anchored_tta_views: the same views averaged, no update."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from engine_checks import plain_logits, snapshot, unchanged
from texts import REVIEWS

from ttt_pipeline.config import TTTConfig, load_config
from ttt_pipeline.defenses import registry
from ttt_pipeline.defenses.anchored_tta import AnchoredTTA, Settings, ViewAverage, adapted_parameters, kl_to
from ttt_pipeline.defenses.base import EngineSettings, RowHashMasker
from ttt_pipeline.defenses.mask_ensemble import MaskEnsemble
from ttt_pipeline.defenses.params import layernorm_parameters, select_parameters
from ttt_pipeline.errors import ConfigError
from ttt_pipeline.modeling.model import special_token_ids

pytestmark = pytest.mark.usefixtures("one_thread")
SETTINGS = EngineSettings(precision="fp32")
# the tiny random classifier is never confident: confidence 0 lets every review supply targets
BOLD = dict(lr=1e-2, steps=3, confidence=0.0, view_mask_rate=0.3)


def engine(tiny_clf, cls=AnchoredTTA, settings: EngineSettings = SETTINGS, **own):
    model, tok = tiny_clf
    return cls(model, tok.mask_token_id, special_token_ids(tok), settings, Settings(**{**BOLD, **own}))


def batch(tok, texts, length=None):
    kw = dict(padding="max_length", max_length=length) if length else dict(padding=True)
    enc = tok(list(texts), truncation=True, return_tensors="pt", **kw)
    return enc["input_ids"], enc["attention_mask"]


def kl_from_source(adapted: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    logq, logp = F.log_softmax(source, -1), F.log_softmax(adapted, -1)
    return (logq.exp() * (logq - logp)).sum(-1)


def test_name_resolves_and_ttt_settings_validate(tiny_clf):
    model, tok = tiny_clf
    for name, cls in (("anchored_tta", AnchoredTTA), ("anchored_tta_views", ViewAverage)):
        method = registry.parse(name)
        assert method.masked and not registry.needs_mlm(name) and registry.parse(f"spell+{name}").engine == name
        cfg = TTTConfig(anchored_tta={"lr": 1e-3, "steps": 4, "views": 3, "view_mask_rate": 0.2, "confidence": 0.5,
                                      "anchor_weight": 0.7})
        built = registry.build_engine(name, model, tok, cfg)
        assert type(built) is cls and built.steps == 4 and built.own.views == 3 and built.own.anchor_weight == 0.7
        assert built.opt.param_groups[0]["lr"] == 1e-3 and built.mask_fn.mask_prob == 0.2
        assert built.own.confidence == 0.5 and built.mask_token_id == tok.mask_token_id
    # one section, ttt.anchored_tta, for the defense and its control
    types = registry.settings_types()
    assert types["anchored_tta"] is Settings and "anchored_tta_views" not in types
    cfg = load_config(None, ["ttt.methods=[none, anchored_tta, anchored_tta_views]", "ttt.anchored_tta.steps=5",
                             "ttt.anchored_tta.anchor_weight=0.5"])
    assert cfg.ttt.anchored_tta.steps == 5 and cfg.ttt.anchored_tta.anchor_weight == 0.5
    for bad in ("confidence=1.5", "anchor_weight=-0.1", "views=0", "view_mask_rate=1", "lr=0", "nope=1"):
        with pytest.raises(ConfigError, match="anchored_tta"):
            load_config(None, [f"ttt.anchored_tta.{bad}"])
    defaults = registry.build_engine("anchored_tta", model, tok, EngineSettings())
    assert defaults.own == Settings() and (defaults.steps, defaults.own.views) == (2, 2)


def test_episodic_whatever_ttt_online_says(tiny_clf):
    adapted = engine(tiny_clf, settings=EngineSettings(online=True, precision="fp32"))
    assert not adapted.s.online and adapted.guard is None and adapted.draws == 1


def test_kl_to_has_the_exact_gradient():
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.0, 0.3, -0.2]], requires_grad=True)
    target = F.log_softmax(torch.tensor([[0.1, 0.2, 0.3], [1.0, 0.0, 0.0]]), -1)
    value = kl_to(target, logits)
    expected = F.kl_div(F.log_softmax(logits, -1), target, log_target=True, reduction="none").sum(-1)
    assert torch.allclose(value, expected, atol=1e-7)
    value.sum().backward()
    assert torch.allclose(logits.grad, logits.detach().softmax(-1) - target.exp(), atol=1e-7)
    same = torch.tensor([[0.7, -0.4, 0.1]], requires_grad=True)
    kl_to(F.log_softmax(same.detach(), -1), same).sum().backward()
    assert torch.equal(same.grad, torch.zeros_like(same))  # zero at the target, not a rounding error


def test_only_encoder_layernorm_and_bias_parameters_move(tiny_clf, recipe_batch):
    model, _ = tiny_clf
    adapted = engine(tiny_clf)
    chosen = {id(p) for p in adapted_parameters(model)}
    expected = {id(p) for p in layernorm_parameters(model)} | {id(p) for p in select_parameters(model, "bias")}
    assert {id(p) for p in adapted.params} == chosen == expected and len(adapted.params) == len(chosen)
    assert not chosen & {id(p) for p in model.head.parameters()}
    assert not chosen & {id(p) for p in model.mlm_head.parameters()}
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    adapted.adapt(*recipe_batch)  # leaves the adapted weights in place
    try:
        moved = {name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])}
        ids = {name: id(p) for name, p in model.named_parameters()}
        assert moved and all(ids[name] in chosen for name in moved)
        assert any(name.endswith("LayerNorm.weight") for name in moved)
        assert any(name.endswith("dense.bias") for name in moved)
    finally:
        adapted.reset()
    assert all(torch.equal(p.detach(), before[name]) for name, p in model.named_parameters())


def test_predict_restores_the_weights_bit_for_bit_and_moves_the_prediction(tiny_clf, recipe_batch):
    model, _ = tiny_clf
    before = snapshot(model)
    storage = [p.data_ptr() for p in model.parameters()]
    model.train()
    try:
        adapted = engine(tiny_clf)
        out = adapted.predict(*recipe_batch)
        training = model.training
    finally:
        model.eval()
    assert training and unchanged(model, before) and [p.data_ptr() for p in model.parameters()] == storage
    assert out.dtype == torch.float32 and not out.is_inference()
    assert adapted.stats["steps"] == 3 and adapted.stats["confident_rows"] == len(REVIEWS)
    source = plain_logits(model, *recipe_batch)
    assert float((out - source).abs().max()) > 1e-3  # the steps did something
    again = adapted.predict(*recipe_batch)  # the next unit starts from the source weights again
    assert torch.equal(out, again)


def test_zero_steps_is_the_plain_model(tiny_clf, recipe_batch):
    model, _ = tiny_clf
    adapted = engine(tiny_clf, steps=0)
    out = adapted.predict(*recipe_batch)
    assert adapted.stats["steps"] == 0
    assert torch.allclose(out, plain_logits(model, *recipe_batch), atol=1e-6)


def test_full_anchor_weight_keeps_the_frozen_models_prediction(tiny_clf, recipe_batch):
    """a = 1: the loss is the anchor alone, whose gradient is exactly zero at the source weights: nothing moves,
    under Adam too (which would blow a rounding-error gradient up to a full step)."""
    model, _ = tiny_clf
    source = plain_logits(model, *recipe_batch)
    anchored = engine(tiny_clf, anchor_weight=1.0)
    anchored.adapt(*recipe_batch)
    try:
        assert anchored.flat.changed() == []
    finally:
        anchored.reset()
    assert torch.allclose(anchored.predict(*recipe_batch), source, atol=1e-6)
    sgd = engine(tiny_clf, settings=EngineSettings(optimizer="sgd", precision="fp32"), anchor_weight=1.0, lr=10.0)
    assert torch.allclose(sgd.predict(*recipe_batch), source, atol=1e-6)


def test_the_anchor_pulls_toward_the_frozen_model(tiny_clf, recipe_batch):
    """From the second step on, a larger anchor weight leaves the prediction closer to the source's (SGD at a
    stable learning rate: a step too large for the anchor's curvature overshoots the source). Closeness is the
    logits' distance: the KL of so small a move is of the order of float32 rounding on some CPUs."""
    model, _ = tiny_clf
    source = plain_logits(model, *recipe_batch)
    sgd = EngineSettings(optimizer="sgd", precision="fp32")
    drift = {a: float((engine(tiny_clf, settings=sgd, anchor_weight=a, lr=2.0, steps=4).predict(*recipe_batch)
                       - source).double().norm()) for a in (0.0, 0.5, 0.9)}
    assert drift[0.0] > drift[0.5] > drift[0.9] > 0
    # one step: the anchor is zero at the source weights, so the step is the consistency step scaled by 1 - a
    one = [engine(tiny_clf, settings=sgd, anchor_weight=a, lr=lr, steps=1).predict(*recipe_batch)
           for a, lr in ((0.0, 100.0), (0.75, 400.0))]
    assert torch.allclose(one[0], one[1], atol=1e-6) and not torch.allclose(one[0], source, atol=1e-3)


def test_unconfident_reviews_supply_no_targets(tiny_clf, recipe_batch):
    model, _ = tiny_clf
    top = plain_logits(model, *recipe_batch).softmax(-1).max(-1).values
    nobody = engine(tiny_clf, confidence=1.0)
    out = nobody.predict(*recipe_batch)
    assert nobody.stats["steps"] == 0 and nobody.stats["filtered_rows"] == len(REVIEWS)
    assert torch.allclose(out, plain_logits(model, *recipe_batch), atol=1e-6)
    threshold = float(top.median())
    some = engine(tiny_clf, confidence=threshold)
    some.predict(*recipe_batch)
    assert some.stats["confident_rows"] == int((top >= threshold).sum()) and 0 < some.stats["confident_rows"] < 4
    # the unit's step is the step on its confident reviews alone: the unconfident ones add nothing to the
    # gradient (SGD; the loss is divided by the unit's size, hence the learning rates in its ratio)
    confident = top >= threshold
    sgd = EngineSettings(optimizer="sgd", precision="fp32")
    whole = engine(tiny_clf, settings=sgd, confidence=threshold, steps=1, lr=100.0 * len(top) / int(confident.sum()))
    whole.adapt(*recipe_batch)
    moved = [f.data.clone() for f in whole.flat.flat]
    whole.reset()
    alone = engine(tiny_clf, settings=sgd, confidence=0.0, steps=1, lr=100.0)
    ids, am = recipe_batch
    alone.adapt(ids[confident], am[confident])
    expected = [f.data.clone() for f in alone.flat.flat]
    alone.reset()
    step = max(float((a - s).abs().max()) for a, s in zip(moved, whole.flat.source_values()))
    assert step > 0 and all(torch.allclose(a, b, atol=1e-4 * step, rtol=0) for a, b in zip(moved, expected))


def test_control_changes_no_weight_and_averages_the_views(tiny_clf):
    model, tok = tiny_clf
    ids, am = batch(tok, REVIEWS)
    before = snapshot(model)
    control = engine(tiny_clf, ViewAverage, views=3)
    out = control.predict(ids, am)
    assert unchanged(model, before) and control.stats["steps"] == 0
    masker = RowHashMasker(0.3, special_token_ids(tok), seed=SETTINGS.seed)
    masks = [masker(ids, am, v) for v in range(3)]
    assert all(torch.equal(m, v) for m, v in zip(masks, control.view_masks(ids, am)))
    assert all(m.any() for m in masks)
    with torch.inference_mode():
        probs = torch.stack([model(ids.masked_fill(m, tok.mask_token_id), am).softmax(-1) for m in masks]).mean(0)
    assert torch.allclose(out.exp(), probs, atol=1e-6)
    # the same views as mask_ensemble's first copies at the same rate and seed
    ensemble = MaskEnsemble(model, tok.mask_token_id, special_token_ids(tok),
                            EngineSettings(mask_prob=0.3, precision="fp32"), copies=3)
    assert torch.allclose(out, ensemble.predict(ids, am), atol=1e-5)
    # and the views anchored_tta adapts on
    assert all(torch.equal(a, b) for a, b in zip(engine(tiny_clf, views=3).view_masks(ids, am), masks))


def test_deterministic_per_seed(tiny_clf):
    _, tok = tiny_clf
    ids, am = batch(tok, REVIEWS)
    for cls in (AnchoredTTA, ViewAverage):
        seeded = [engine(tiny_clf, cls, EngineSettings(seed=s, precision="fp32")).predict(ids, am) for s in (1, 1, 2)]
        assert torch.equal(seeded[0], seeded[1]) and not torch.allclose(seeded[0], seeded[2], atol=1e-4), cls


def test_a_review_alone_or_in_a_batch(tiny_clf):
    """Per sample, a review's result does not depend on the batch around it, its padding or its order; the
    control's never does."""
    _, tok = tiny_clf
    for cls, unit in ((AnchoredTTA, "sample"), (ViewAverage, "batch")):
        run = engine(tiny_clf, cls, EngineSettings(unit=unit, precision="fp32"))
        together = run.predict(*batch(tok, REVIEWS, length=40))
        for i, text in enumerate(REVIEWS):
            assert torch.allclose(run.predict(*batch(tok, [text]))[0], together[i], atol=1e-5), (cls, i)
        assert torch.allclose(run.predict(*batch(tok, REVIEWS[::-1])).flip(0), together, atol=1e-5), cls


def test_sub_batches_give_the_whole_units_step(tiny_clf):
    _, tok = tiny_clf
    ids, am = batch(tok, REVIEWS)
    whole = engine(tiny_clf).predict(ids, am)
    split = engine(tiny_clf, settings=EngineSettings(sub_batch_tokens=16, precision="fp32"))
    assert len(split.chunks(am)) > 1
    assert torch.allclose(split.predict(ids, am), whole, atol=1e-4)


def test_runs_on_a_sequence_classifier_without_an_mlm_head(tmp_path):
    """A Hugging Face BertForSequenceClassification imported as the pipeline's SequenceClassifier: only its
    logits are used, so both engines run without any MLM head."""
    from hf_models import save_classifier

    from ttt_pipeline.config import ModelConfig
    from ttt_pipeline.modeling.hf_classifier import SequenceClassifier, Source, import_classifier
    from ttt_pipeline.modeling.loading import load_model

    folder = save_classifier(tmp_path / "bert-clf")
    src = Source(str(folder), str(folder), str(folder))
    import_classifier(src, ["negative", "positive"], ModelConfig(name=str(folder)), None, False, tmp_path / "model")
    model, tok = load_model(tmp_path / "model")
    assert isinstance(model, SequenceClassifier) and model.mlm_head is None
    ids, am = batch(tok, REVIEWS)
    before = snapshot(model)
    source = plain_logits(model, ids, am)
    cfg = TTTConfig(precision="fp32", anchored_tta=BOLD)
    adapted = registry.build_engine("anchored_tta", model, tok, cfg)
    assert not {id(p) for p in adapted.params} & {id(p) for p in model.head.parameters()}
    out = adapted.predict(ids, am)
    assert adapted.stats["steps"] == 3 and float((out - source).abs().max()) > 1e-4
    control = registry.build_engine("anchored_tta_views", model, tok, cfg).predict(ids, am)
    assert control.shape == out.shape == (len(REVIEWS), 2)
    assert unchanged(model, before)
