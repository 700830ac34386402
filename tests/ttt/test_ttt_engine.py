"""MaskedTTT and Tent engines on a tiny random BERT: isolation, reproducibility and every option."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from texts import REVIEWS

from ttt_pipeline.config import TTTConfig
from ttt_pipeline.defenses import tent as tent_defense
from ttt_pipeline.defenses.base import CollapseGuard, EngineSettings, RowHashMasker
from ttt_pipeline.defenses.masked_ttt import MaskedTTT
from ttt_pipeline.defenses.params import drop_optimizer_state, encoder_layers, make_optimizer, select_parameters
from ttt_pipeline.defenses.registry import build_engine
from ttt_pipeline.defenses.tent import TentEngine
from ttt_pipeline.modeling.model import special_token_ids

TEXTS = [*REVIEWS,
         "i returned it : the screen flickers whenever the fan spins up and the remote is flimsy",
         "five stars , would buy again"]


def batch(tok, texts, length=None):
    kw = dict(padding="max_length", max_length=length) if length else dict(padding=True)
    enc = tok(list(texts), truncation=True, return_tensors="pt", **kw)
    return enc["input_ids"], enc["attention_mask"]


def engine(tiny_clf, **kw):
    model, tok = tiny_clf
    kw.setdefault("mask_prob", 0.3)
    kw.setdefault("lr", 1e-3)
    return MaskedTTT(model, tok.mask_token_id, special_token_ids(tok), EngineSettings(**kw))


def weights(model):
    return [p.detach().clone() for p in model.parameters()]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def changed_names(model, before):
    return {n for (n, p), b in zip(model.named_parameters(), before) if not torch.equal(p, b)}


# ----------------------------------------------------------------------------------------- isolation
@pytest.mark.parametrize("kw", [dict(unit="batch"), dict(unit="sample"), dict(unit="batch", views=2, steps=2),
                                dict(unit="sample", params="layernorm", optimizer="sgd"),
                                dict(unit="batch", draws=3, steps=2)])
def test_weights_bit_identical_after_a_test_set(tiny_clf, kw):
    """Episodic: after many units the model is exactly the source model (restore in place, no leak)."""
    model, tok = tiny_clf
    before = weights(model)
    storage = [p.data_ptr() for p in model.parameters()]
    eng = engine(tiny_clf, **kw)
    for i in range(3):
        ids, am = batch(tok, TEXTS[i:i + 3])
        out = eng.predict(ids, am)
        assert out.shape == (ids.shape[0], 3) and out.dtype == torch.float32
    assert eng.stats["steps"] > 0
    assert same(before, weights(model))
    assert storage == [p.data_ptr() for p in model.parameters()]  # handed back on its own tensors
    assert all(p.grad is None for p in model.parameters())


def test_per_sample_prediction_independent_of_batch(tiny_clf):
    """Per-sample units: a review's logits are bit-identical alone, in any batch, at any padding length."""
    model, tok = tiny_clf
    eng = engine(tiny_clf, unit="sample", lr=1e-2, seed=1)
    target = TEXTS[2]
    ids, am = batch(tok, [target])
    alone = eng.predict(ids, am)[0]
    for others, length in ((TEXTS[:2], None), (TEXTS[3:], 48), ([TEXTS[0]] * 4, 64)):
        b_ids, b_am = batch(tok, [*others, target], length)
        assert torch.equal(eng.predict(b_ids, b_am)[-1], alone)
        b_ids, b_am = batch(tok, [target, *others], length)
        assert torch.equal(eng.predict(b_ids, b_am)[0], alone)
    assert eng.stats["steps"] > 0
    with torch.no_grad():
        assert not torch.allclose(model(ids, am)[0], alone, atol=1e-4)  # and it changed the prediction


def test_same_seed_same_predictions_other_seed_differs(tiny_clf):
    model, tok = tiny_clf
    ids, am = batch(tok, TEXTS)
    a = engine(tiny_clf, seed=3, lr=1e-2).predict(ids, am)
    b = engine(tiny_clf, seed=3, lr=1e-2).predict(ids, am)
    c = engine(tiny_clf, seed=4, lr=1e-2).predict(ids, am)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_batch_mode_independent_of_evaluation_order(tiny_clf):
    """Masks come from row contents, not a running RNG: re-running a batch later gives the same logits."""
    model, tok = tiny_clf
    eng = engine(tiny_clf, lr=1e-2)
    first = batch(tok, TEXTS[:3])
    a = eng.predict(*first)
    eng.predict(*batch(tok, TEXTS[3:]))
    assert torch.equal(eng.predict(*first), a)


def test_masker_is_row_local_and_respects_specials(tiny_clf):
    model, tok = tiny_clf
    masker = RowHashMasker(0.25, special_token_ids(tok), seed=0)
    ids, am = batch(tok, TEXTS, 64)
    m = masker(ids, am, 0)
    special = torch.isin(ids, torch.tensor(special_token_ids(tok)))
    assert not (m & special).any() and not (m & ~am.bool()).any()
    for i in range(len(TEXTS)):  # the same row alone and unpadded gets the same mask
        n = int(am[i].sum())
        assert torch.equal(masker(ids[i:i + 1, :n], am[i:i + 1, :n], 0)[0], m[i, :n])
    assert not torch.equal(masker(ids, am, 1), m)  # another draw, another mask
    rows = torch.randint(1000, 20000, (2000, 20), generator=torch.Generator().manual_seed(0))
    rate = masker(rows, torch.ones_like(rows), 0).float().mean()
    assert 0.24 < float(rate) < 0.26  # 40,000 Bernoulli(0.25) draws


def test_sub_batches_give_the_same_logits(tiny_clf):
    """Length-sorted sub-batches accumulate the same gradient as one forward over the unit."""
    model, tok = tiny_clf
    ids, am = batch(tok, TEXTS, 64)
    whole = engine(tiny_clf, sub_batch_tokens=0, lr=1e-2, views=2).predict(ids, am)
    for sub in (1, 40, 100):
        eng = engine(tiny_clf, sub_batch_tokens=sub, lr=1e-2, views=2)
        parts = eng.chunks(am)
        assert len(parts) > 1 and sorted(torch.cat(parts).tolist()) == list(range(len(TEXTS)))
        lengths = am.sum(1)
        assert all(len(p) == 1 or len(p) * int(lengths[p].max()) <= sub for p in parts)
        assert torch.allclose(eng.predict(ids, am), whole, atol=1e-5)


def test_mlm_head_only_at_masked_positions_and_not_when_predicting(tiny_clf):
    model, tok = tiny_clf
    rows = []
    hook = model.mlm_head.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[0]))
    try:
        ids, am = batch(tok, TEXTS)
        masker = RowHashMasker(0.3, special_token_ids(tok), seed=0)
        eng = engine(tiny_clf, sub_batch_tokens=0, steps=2)
        eng.mask_fn = masker
        eng.predict(ids, am)
    finally:
        hook.remove()
    assert rows == [int(masker(ids, am, 0).sum()), int(masker(ids, am, 1).sum())]


def test_model_mode_and_requires_grad_restored(tiny_clf):
    model, tok = tiny_clf
    model.train()
    flags = [p.requires_grad for p in model.parameters()]
    seen = []
    hook = model.head.register_forward_hook(lambda m, i, o: seen.append(m.training))
    try:
        engine(tiny_clf, params="layernorm").predict(*batch(tok, TEXTS[:2]))
        out = engine(tiny_clf).predict(*batch(tok, TEXTS[:2]))
    finally:
        hook.remove()
        assert model.training
        model.eval()
    assert seen and not any(seen)  # dropout off while adapting and predicting
    assert flags == [p.requires_grad for p in model.parameters()]
    assert not out.requires_grad and not out.is_inference()


def test_backward_accumulates_into_the_optimizers_gradient_and_no_weight_copy_is_kept(tiny_clf):
    """FlatParams: each adapted parameter's .grad is a view of its group's flat gradient while adapting, so the
    flat gradient is autograd's own (the same numbers a gather gave) and the engine holds the adapted weights twice
    (buffer, gradient; the source values are the model's own tensors): Adam's two moments only while a unit takes
    several steps."""
    model, tok = tiny_clf
    eng = engine(tiny_clf, steps=1, sub_batch_tokens=64)  # several sub-batches: the gradient accumulates
    ids, am = batch(tok, TEXTS[:6])
    assert len(eng.chunks(am)) > 1
    seen, loss_of = [], eng.chunk_loss

    def recording(*args):
        flat = eng.flat.flat[0].grad
        seen.append(all(p.grad is not None and p.grad.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
                        for p in eng.params))
        return loss_of(*args)

    eng.chunk_loss = recording
    eng.adapt(ids, am)
    del eng.chunk_loss
    assert seen and all(seen)
    got = eng.flat.flat[0].grad.clone()
    assert all(p.grad is None for p in eng.params)
    eng.reset()
    eng.flat.attach()
    ctx = eng.prepare(ids, am, 0)
    total = sum(eng.chunk_loss(*eng._slice(ids, am, rows), rows, ctx) for rows in eng.chunks(am))
    grads = torch.autograd.grad(total, eng.params, allow_unused=True)
    eng.reset()
    want = torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for p, g in zip(eng.params, grads)])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    n = sum(p.numel() for p in eng.params)
    kept = [t for v in vars(eng.flat).values() for t in (v if isinstance(v, list) else [v]) if torch.is_tensor(t)]
    def moments():
        return [v for st in eng.opt.state.values() for v in st.values() if torch.is_tensor(v) and v.numel() > 1]

    held = [t for t in kept if t.numel() == n] + [eng.flat.flat[0].grad]
    assert [t.numel() for t in held] == [n] * 2 and moments() == []  # between units: no moments held
    eng.adapt(ids, am)
    assert moments() == []  # one step per unit: taken slice by slice, each slice's moments freed at once
    eng.reset()
    two = engine(tiny_clf, steps=2)
    two.adapt(ids, am)
    assert [t.numel() for t in two.opt.state[two.flat.flat[0]].values() if t.numel() > 1] == [n] * 2
    two.reset()
    assert not two.opt.state


def test_flat_params_bind_each_groups_gradient_and_restore_every_group():
    """Parameters of two dtypes: two flat buffers; each parameter's .grad is a view of its own group's gradient,
    a parameter without a gradient keeps zeros, and restore() gives every group its source values back."""
    from ttt_pipeline.defenses.params import FlatParams

    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(4))
    c, unused = torch.nn.Parameter(torch.randn(5).bfloat16()), torch.nn.Parameter(torch.randn(2))
    source = [p.detach().clone() for p in (a, b, c, unused)]
    flat = FlatParams([a, b, c, unused])
    assert [f.dtype for f in flat.flat] == [torch.float32, torch.bfloat16]
    flat.attach()
    for _ in range(2):  # the second time: the gradients allocated once are zeroed, not re-allocated
        flat.bind_grads()
        ((a * 2).sum() + (b ** 2).sum() + (c.float() * 3).sum()).backward()
    fp32, bf16 = (f.grad for f in flat.flat)
    def storage(t):
        return t.untyped_storage().data_ptr()

    assert storage(a.grad) == storage(b.grad) == storage(fp32) and storage(c.grad) == storage(bf16)
    assert torch.equal(fp32, torch.cat([torch.full((6,), 2.0), 2 * source[1], torch.zeros(2)]))
    assert torch.equal(bf16, torch.full((5,), 3.0, dtype=torch.bfloat16))
    flat.unbind_grads()
    assert all(p.grad is None for p in (a, b, c, unused))
    with torch.no_grad():
        for f in flat.flat:
            f.add_(1)
    assert not torch.equal(a, source[0]) and not torch.equal(c, source[2])
    flat.restore()
    assert all(torch.equal(p, s) for p, s in zip((a, b, c, unused), source))
    flat.detach()
    assert all(torch.equal(p, s) for p, s in zip((a, b, c, unused), source))


@pytest.mark.parametrize("name, momentum", [("adam", 0.0), ("adamw", 0.0), ("sgd", 0.9), ("sgd", 0.0)])
def test_a_step_in_slices_equals_the_whole_step_bit_for_bit(name, momentum):
    """fresh_step_in_slices: slices that do not divide the buffer, two dtype groups and a parameter without a
    gradient give the whole fresh step's values exactly, and no state is left; a held state is refused."""
    from ttt_pipeline.defenses.params import fresh_step_in_slices

    torch.manual_seed(0)
    source = [torch.randn(1000), torch.randn(77).bfloat16(), torch.randn(5)]
    grads = [torch.randn(1000) * 1e-3, torch.randn(77).bfloat16(), None]
    whole, sliced = ([torch.nn.Parameter(s.clone()) for s in source] for _ in range(2))
    for ps in (whole, sliced):
        for p, g in zip(ps, grads):
            p.grad = None if g is None else g.clone()
    make_optimizer(whole, name, 1e-2, momentum).step()
    opt = make_optimizer(sliced, name, 1e-2, momentum)
    fresh_step_in_slices(opt, numel=64)
    assert all(torch.equal(a, b) for a, b in zip(whole, sliced)) and not opt.state
    assert not torch.equal(sliced[0], source[0]) and torch.equal(sliced[2], source[2])
    assert opt.param_groups[0]["params"] == sliced
    if momentum or name != "sgd":
        opt.step()
        with pytest.raises(ValueError, match="holds state"):
            fresh_step_in_slices(opt)


def test_dropped_optimizer_state_equals_fresh_optimizer():
    """Dropping the optimizer's state gives bit-for-bit a fresh optimizer's first step, and holds no moments."""
    torch.manual_seed(0)
    for name, momentum in (("adam", 0.0), ("adamw", 0.0), ("sgd", 0.9)):
        p = torch.nn.Parameter(torch.randn(50))
        q = torch.nn.Parameter(p.detach().clone())
        opt = make_optimizer([p], name, 1e-2, momentum)
        for _ in range(3):
            p.grad = torch.randn(50)
            opt.step()
        drop_optimizer_state(opt)
        assert not opt.state
        with torch.no_grad():
            p.copy_(q)
        g = torch.randn(50)
        p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        make_optimizer([q], name, 1e-2, momentum).step()
        assert torch.equal(p, q)


# ------------------------------------------------------------------------------------------- options
@pytest.mark.parametrize("which", ["all", "layernorm", "top_k", "bias"])
def test_parameter_selection_adapts_only_what_it_says(tiny_clf, which):
    model, tok = tiny_clf
    before = weights(model)
    eng = engine(tiny_clf, params=which, top_k=1, lr=1e-2, sub_batch_tokens=0)
    loss = eng.adapt(*batch(tok, TEXTS))
    assert loss is not None and math.isfinite(loss)
    changed = changed_names(model, before)
    eng.reset()
    assert same(before, weights(model))
    assert changed
    names = {id(p): n for n, p in model.named_parameters()}
    selected = {names[id(p)] for p in select_parameters(model, which, 1)}
    assert changed <= selected
    if which == "layernorm":
        assert all("LayerNorm" in n and "cls." not in n for n in changed)
    if which == "bias":
        assert all(n.endswith("bias") for n in changed)
    if which == "top_k":
        last = {id(p) for p in encoder_layers(model)[-1].parameters()}
        assert all(id(dict(model.named_parameters())[n]) in last for n in changed)
    if which == "all":  # encoder and MLM head move; the classifier head gets no MLM gradient
        assert any(n.startswith("mlm_model.cls.") for n in changed)
        assert any("encoder.layer.0." in n for n in changed)
        assert not any(n.startswith("head.") for n in changed)


@pytest.mark.parametrize("opt", ["sgd", "adamw", "adam"])
def test_optimizers_work(tiny_clf, opt):
    model, tok = tiny_clf
    ids, am = batch(tok, TEXTS)
    with torch.no_grad():
        plain = model(ids, am)
    out = engine(tiny_clf, optimizer=opt, lr=1.0 if opt == "sgd" else 1e-2).predict(ids, am)
    assert torch.isfinite(out).all()
    assert (out - plain).abs().max() > 1e-4


def test_views_average_the_loss(tiny_clf):
    """views=3: the step's loss is the mean over views of each view's masked-token cross-entropy; a view
    with no masked token is left out of the mean."""
    model, tok = tiny_clf
    ids, am = batch(tok, TEXTS)
    base = RowHashMasker(0.3, special_token_ids(tok), seed=0)

    def mask_fn(i, a, draw):
        return torch.zeros_like(a, dtype=torch.bool) if draw == 1 else base(i, a, draw)

    eng = engine(tiny_clf, views=3, sub_batch_tokens=40)
    eng.mask_fn = mask_fn
    got = eng.adapt(ids, am)
    eng.reset()
    expected = []
    with torch.no_grad():
        for d in (0, 2):
            m = base(ids, am, d)
            h = model.encode(ids.masked_fill(m, tok.mask_token_id), am)
            expected.append(F.cross_entropy(model.mlm_logits_at(h, m), ids[m]).item())
    assert got == pytest.approx(sum(expected) / 2, rel=1e-5)
    assert got != pytest.approx(expected[0], rel=1e-3)


@pytest.mark.parametrize("unit", ["batch", "sample"])
def test_draws_average_the_probabilities_of_independent_adaptations(tiny_clf, unit):
    """draws=3: three adaptations from the source weights, each on its own masks (draw d, step k uses mask
    draw d x steps + k); the result is the log of their mean class probabilities."""
    model, tok = tiny_clf
    ids, am = batch(tok, TEXTS)
    base = RowHashMasker(0.3, special_token_ids(tok), seed=0)
    probs, steps = [], 0
    for d in range(3):
        one = engine(tiny_clf, lr=1e-2, steps=2, unit=unit)
        one.mask_fn = lambda i, a, k, d=d: base(i, a, d * 2 + k)
        probs.append(one.predict(ids, am).softmax(-1))
        steps += one.stats["steps"]
    eng = engine(tiny_clf, lr=1e-2, steps=2, unit=unit, draws=3)
    got = eng.predict(ids, am)
    assert torch.allclose(got, (sum(probs) / 3).log(), atol=1e-5)
    assert not torch.allclose(probs[0], probs[1], atol=1e-4)  # the draws really differ
    assert eng.stats["steps"] == steps >= 6  # a step without a masked token is skipped, in both
    assert torch.allclose(got.exp().sum(-1), torch.ones(len(TEXTS)), atol=1e-5)


def test_draws_need_episodic_ttt():
    with pytest.raises(ValueError, match="draws > 1 needs episodic"):
        EngineSettings(draws=2, online=True)
    with pytest.raises(ValueError, match="online: false or draws: 1"):
        TTTConfig(draws=2, online=True)
    assert TTTConfig(draws=4).draws == 4


def test_no_maskable_token_means_no_step(tiny_clf):
    model, tok = tiny_clf
    eng = engine(tiny_clf)
    eng.mask_fn = lambda i, a, d: torch.zeros_like(a, dtype=torch.bool)
    ids, am = batch(tok, TEXTS[:2])
    with torch.no_grad():
        plain = model(ids, am)
    assert torch.allclose(eng.predict(ids, am), plain, atol=1e-6)
    assert eng.stats["steps"] == 0


def test_online_mode_keeps_changes(tiny_clf):
    model, tok = tiny_clf
    before = weights(model)
    ids, am = batch(tok, TEXTS)
    episodic = engine(tiny_clf, lr=1e-2)
    e1, e2 = episodic.predict(ids, am), episodic.predict(ids, am)
    assert torch.equal(e1, e2)
    online = engine(tiny_clf, lr=1e-2, online=True)
    try:
        assert torch.equal(online.predict(ids, am), e1)  # the first unit starts from the source weights
        assert not same(before, weights(model))  # and its changes are kept
        assert not torch.equal(online.predict(ids, am), e1)  # so the second unit starts elsewhere
    finally:
        online.close()
    assert same(before, weights(model))


def test_new_engine_starts_from_source_weights_after_an_online_one(tiny_clf):
    """An online engine leaves the model adapted; building the next engine on it restores the source first."""
    model, tok = tiny_clf
    before = weights(model)
    ids, am = batch(tok, TEXTS)
    online = engine(tiny_clf, lr=1e-2, online=True)
    online.predict(ids, am)
    assert not same(before, weights(model))
    fresh = engine(tiny_clf, lr=1e-2)
    assert same(before, weights(model))
    assert getattr(model, "_ttt_attached_engine", None) is None
    assert torch.equal(fresh.predict(ids, am), engine(tiny_clf, lr=1e-2).predict(ids, am))


def test_guard_trips_on_collapse_and_not_on_a_stable_stream():
    g = CollapseGuard(warmup=3, ema=0.5, loss_high=1.5, loss_low=0.25, entropy_low=0.2)
    assert all(g.update(6.0 + 0.1 * (i % 3), 0.8) is None for i in range(20))
    g.restart()
    reasons = [g.update(x, 0.8) for x in (6, 6, 6, 9, 12, 20)]
    assert reasons[:3] == [None] * 3 and any(r and "diverged" in r for r in reasons)
    g.restart()
    reasons = [g.update(x, 0.8) for x in (6, 6, 6, 1, 0.5, 0.1)]
    assert any(r and "MLM loss collapsed" in r for r in reasons)
    g.restart()
    reasons = [g.update(6.0, e) for e in (0.8, 0.8, 0.8, 0.05, 0.01, 0.0)]
    assert any(r and "entropy collapsed" in r for r in reasons)
    g.restart()
    assert "loss" in g.update(float("nan"), 0.5)


def test_online_guard_resets_a_diverging_model(tiny_clf):
    """A huge SGD step diverges the MLM loss; the guard restores the source weights and counts it."""
    model, tok = tiny_clf
    before = weights(model)
    ids, am = batch(tok, TEXTS)
    eng = engine(tiny_clf, online=True, optimizer="sgd", lr=50.0, guard_warmup=1, guard_ema=1.0)
    try:
        for _ in range(4):
            eng.predict(ids, am)
        assert eng.stats["resets"] >= 1 and eng.reset_reasons
        unguarded = engine(tiny_clf, online=True, optimizer="sgd", lr=50.0, guard=False)
        assert unguarded.guard is None
    finally:
        eng.reset()
    assert same(before, weights(model))


# ----------------------------------------------------------------------------------------------- tent
def test_tent_changes_only_layernorm_affine_and_restores(tiny_clf):
    model, tok = tiny_clf
    before = weights(model)
    ids, am = batch(tok, TEXTS)
    eng = TentEngine(model, EngineSettings(sub_batch_tokens=40), tent_defense.Settings(lr=1e-2, steps=3))
    with torch.no_grad():
        plain = model(ids, am)
    ent0 = -(plain.softmax(-1) * plain.log_softmax(-1)).sum(-1).mean()
    eng.adapt(ids, am)
    changed = changed_names(model, before)
    with torch.no_grad():
        adapted = model(ids, am)
    ent1 = -(adapted.softmax(-1) * adapted.log_softmax(-1)).sum(-1).mean()
    eng.reset()
    assert changed and all("LayerNorm" in n and n.startswith("mlm_model.bert.") for n in changed)
    assert ent1 < ent0  # entropy minimisation did minimise entropy
    out = eng.predict(ids, am)
    assert torch.allclose(out, adapted, atol=1e-5)
    assert same(before, weights(model))


# ---------------------------------------------------------------------------------------- build/config
def test_build_engine_from_config(tiny_clf):
    model, tok = tiny_clf
    cfg = TTTConfig(methods=["none", "masked_ttt", "tent"], mask_prob=0.2, steps=2, lr=1e-4, optimizer="sgd",
                    params="bias", views=2, unit="sample", seed=7, tent={"lr": 1e-3, "steps": 2})
    assert build_engine("none", model, tok, cfg) is None
    masked = build_engine("masked_ttt", model, tok, cfg)
    assert isinstance(masked, MaskedTTT) and masked.s.views == 2 and masked.s.unit == "sample"
    assert masked.mask_fn.mask_prob == 0.2 and masked.mask_fn.seed == 7 and masked.steps == 2
    tent = build_engine("tent", model, tok, cfg)
    assert isinstance(tent, TentEngine) and tent.steps == 2
    assert tent.opt.param_groups[0]["lr"] == 1e-3
    assert masked.s is cfg  # the engines take the validated `ttt` section itself, no copy into another type
    with pytest.raises(ValueError):
        build_engine("nope", model, tok, cfg)
    with pytest.raises(ValueError):
        EngineSettings(params="heads")


@pytest.mark.parametrize("precision, dtype", [("auto", torch.float32), ("fp32", torch.float32),
                                              ("bf16", torch.bfloat16)])
def test_precision_sets_the_cpu_compute_dtype(tiny_clf, precision, dtype):
    """The run's scoring precision, resolved once (Runtime) and handed to the engine by build_engine: auto (on a CPU
    without native bf16, pinned by conftest) and fp32 keep float32 (parity); bf16 autocasts both the adapt and the
    prediction passes, gives logits close to fp32 and still restores the source weights bit for bit."""
    from ttt_pipeline.defenses.registry import build_engine
    from ttt_pipeline.modeling.precision import resolve_runtime

    model, tok = tiny_clf
    settings = EngineSettings(mask_prob=0.3, lr=1e-3)
    amp = resolve_runtime("cpu", score_precision=precision).score.dtype
    seen = []
    layer = next(m for m in model.encoder.modules() if isinstance(m, torch.nn.Linear))
    hook = layer.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    before = weights(model)
    ids, am = batch(tok, TEXTS[:4])
    try:
        out = build_engine("masked_ttt", model, tok, settings, amp).predict(ids, am)
    finally:
        hook.remove()
    assert len(seen) == 2 and set(seen) == {dtype}  # one adapt forward, one prediction forward
    assert out.dtype == torch.float32
    assert torch.allclose(out, build_engine("masked_ttt", model, tok, settings).predict(ids, am), atol=5e-2)
    assert same(before, weights(model))


def test_precision_is_validated():
    with pytest.raises(ValueError, match="precision"):
        EngineSettings(precision="fp16")
    with pytest.raises(ValueError, match="precision"):
        TTTConfig(precision="fp16")
    assert TTTConfig(precision="bf16").precision == "bf16"


def test_predict_hands_the_source_weights_back_after_an_online_set(tiny_clf):
    """`evaluate.predict` closes its engine: an online engine's adapted weights never leak into the next set
    or into plain scoring (the bench and the evaluate step rely on it)."""
    from ttt_pipeline.evaluation.scoring import predict

    model, tok = tiny_clf
    before = weights(model)
    texts = [f"the battery of this charger {w} died after {n} days" for n, w in enumerate(
        ["quickly", "slowly", "again", "twice", "suddenly", "finally"] * 4)]
    plain_before = predict(model, tok, texts, 32, 8)
    cfg = TTTConfig(online=True, lr=1e-2, batch_size=4, mask_prob=0.3)

    logits = predict(model, tok, texts, 32, cfg.batch_size, build_engine("masked_ttt", model, tok, cfg))
    preds = logits.argmax(-1).tolist()
    assert len(preds) == len(texts) and set(preds) <= {0, 1, 2}
    assert same(before, weights(model))
    assert (predict(model, tok, texts, 32, 8) == plain_before).all()

    # the engine on its own keeps the adapted weights until closed (what predict's close undoes)
    eng = build_engine("masked_ttt", model, tok, cfg)
    eng.predict(*batch(tok, texts[:4]))
    assert not same(before, weights(model))
    eng.close()
    assert same(before, weights(model))
