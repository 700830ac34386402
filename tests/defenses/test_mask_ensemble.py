"""MaskEnsemble on a tiny random BERT: TTT's own masks, no weight change, batch-independent, seeded."""

from __future__ import annotations

import pytest
import torch
from texts import REVIEWS

from ttt_pipeline.defenses.base import EngineSettings, RowHashMasker
from ttt_pipeline.defenses.mask_ensemble import MaskEnsemble, default_copies
from ttt_pipeline.defenses.masked_ttt import MaskedTTT
from ttt_pipeline.modeling.model import special_token_ids

pytestmark = pytest.mark.usefixtures("one_thread")
TEXTS = REVIEWS


def batch(tok, texts, length=None):
    kw = dict(padding="max_length", max_length=length) if length else dict(padding=True)
    enc = tok(list(texts), truncation=True, return_tensors="pt", **kw)
    return enc["input_ids"], enc["attention_mask"]


def ensemble(tiny_clf, **kw):
    model, tok = tiny_clf
    copies = kw.pop("copies", None)
    kw.setdefault("mask_prob", 0.3)
    return MaskEnsemble(model, tok.mask_token_id, special_token_ids(tok), EngineSettings(**kw), copies=copies)


def test_weights_bit_identical_and_mode_restored(tiny_clf):
    model, tok = tiny_clf
    before = [p.detach().clone() for p in model.parameters()]
    model.train()
    try:
        out = ensemble(tiny_clf).predict(*batch(tok, TEXTS))
    finally:
        training = model.training
        model.eval()
    assert training  # handed back in the mode it came in
    assert out.shape == (len(TEXTS), 3) and out.dtype == torch.float32 and not out.is_inference()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert all(p.grad is None for p in model.parameters())
    assert torch.allclose(out.exp().sum(-1), torch.ones(len(TEXTS)), atol=1e-5)  # log-probabilities


def test_one_copy_is_a_forward_on_ttts_first_mask(tiny_clf):
    model, tok = tiny_clf
    ids, am = batch(tok, TEXTS)
    out = ensemble(tiny_clf, copies=1, seed=5).predict(ids, am)
    mask = RowHashMasker(0.3, special_token_ids(tok), seed=5)(ids, am, 0)
    assert mask.any()
    with torch.inference_mode():
        expected = torch.log_softmax(model(ids.masked_fill(mask, tok.mask_token_id), am), -1)
    assert torch.allclose(out, expected, atol=1e-6)
    with torch.inference_mode():
        plain = torch.log_softmax(model(ids, am), -1)
    assert not torch.allclose(out, plain, atol=1e-4)  # the mask matters


def test_copies_rule_and_masks_are_masked_ttts(tiny_clf):
    model, tok = tiny_clf
    assert default_copies(EngineSettings()) == 4
    assert default_copies(EngineSettings(views=2, steps=3)) == 6
    assert default_copies(EngineSettings(steps=2, draws=3)) == 6
    settings = EngineSettings(mask_prob=0.3, views=2, steps=2, seed=7)
    ids, am = batch(tok, TEXTS)
    seen = []
    masker = RowHashMasker(0.3, special_token_ids(tok), seed=7)
    ens = MaskEnsemble(model, tok.mask_token_id, special_token_ids(tok), settings,
                       mask_fn=lambda i, a, k: seen.append(masker(i, a, k)) or seen[-1])
    ens.predict(ids, am)
    ttt = MaskedTTT(model, tok.mask_token_id, special_token_ids(tok), settings)
    ttt_masks = [m for step in range(2) for m in ttt.prepare(ids, am, step)["masks"]]
    ttt.close()
    assert len(seen) == ens.copies == 4
    assert all(torch.equal(a, b) for a, b in zip(seen, ttt_masks))


def test_row_alone_equals_row_in_a_batch(tiny_clf):
    _, tok = tiny_clf
    ens = ensemble(tiny_clf)
    together = ens.predict(*batch(tok, TEXTS, length=40))
    for i, text in enumerate(TEXTS):
        alone = ens.predict(*batch(tok, [text]))
        assert torch.allclose(alone[0], together[i], atol=1e-5), i
    reordered = ens.predict(*batch(tok, TEXTS[::-1]))
    assert torch.allclose(reordered.flip(0), together, atol=1e-5)


def test_deterministic_per_seed(tiny_clf):
    _, tok = tiny_clf
    ids, am = batch(tok, TEXTS)
    a = ensemble(tiny_clf, seed=1).predict(ids, am)
    assert torch.equal(a, ensemble(tiny_clf, seed=1).predict(ids, am))
    assert not torch.allclose(a, ensemble(tiny_clf, seed=2).predict(ids, am), atol=1e-4)


def test_bf16_precision_runs_close_to_fp32(tiny_clf):
    _, tok = tiny_clf
    ids, am = batch(tok, TEXTS)
    fp32 = ensemble(tiny_clf, precision="fp32").predict(ids, am)
    bf16 = ensemble(tiny_clf, precision="bf16").predict(ids, am)
    assert bf16.dtype == torch.float32 and torch.allclose(fp32, bf16, atol=5e-2)
