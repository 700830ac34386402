"""Parity with torch-ttt 0.0.2's MaskedTTTEngine (the tutorial's TTT), a test-only dependency.

How torch-ttt runs (read from its source): in eval mode `BaseEngine.forward` deep-copies the engine, builds
Adam over every parameter with requires_grad, runs `num_steps` of `ttt_forward` (deep copy of the inputs,
`_mask_tokens` = torch.rand < mask_prob minus `skip_tokens`, the model called as `model(**inputs)`,
nn.CrossEntropyLoss on the hooked module's output at the masked positions) and then predicts under no_grad.
The model is in eval mode throughout, so dropout is off in both engines (the tiny BERT keeps its 0.1
dropout: parity shows eval mode is honoured). Its mask comes from the global RNG, so the test replaces
`_mask_tokens` with our row-hash masks (a plain function survives its deepcopy) and both see the same mask.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from ttt_pipeline.defenses.base import EngineSettings, RowHashMasker
from ttt_pipeline.defenses.masked_ttt import MaskedTTT
from ttt_pipeline.modeling.model import special_token_ids

SHIM = Path(__file__).resolve().parents[2] / "bench" / "_torch_ttt_shim.py"
TEXTS = ["the battery died after two days and support never answered my emails",
         "great little speaker, loud and clear",
         "it works as described . the cable is a bit short but fine for the price overall",
         "terrible"]


def _shim():
    spec = importlib.util.spec_from_file_location("_torch_ttt_shim", SHIM)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def shim():
    pytest.importorskip("torch_ttt", reason="pip install torch-ttt==0.0.2 --no-deps (test dependency)")
    return _shim()


@pytest.fixture(scope="module")
def setup(make_tiny_clf):
    model, tok = make_tiny_clf(max_length=40)
    enc = tok(TEXTS, padding="max_length", max_length=40, truncation=True, return_tensors="pt")
    return model, tok, enc["input_ids"], enc["attention_mask"]


def _reference(shim, model, tok, masker, steps, lr):
    cls = shim.masked_ttt_engine_class()
    eng = cls(shim.reference_wrapper(model), mask_token_id=tok.mask_token_id, features_layer_name="clf.mlm_head",
              mask_prob=masker.mask_prob, skip_tokens=special_token_ids(tok),
              optimization_parameters={"optimizer_name": "adam", "num_steps": steps, "lr": lr})
    eng.eval()
    calls = {"n": 0}

    def mask_tokens(input_ids):  # draw k of the current batch = our step k (views=1)
        mask = masker(input_ids, input_ids != tok.pad_token_id, calls["n"])
        calls["n"] += 1
        return input_ids.masked_fill(mask, tok.mask_token_id), mask

    eng._mask_tokens = mask_tokens

    def predict(ids, am):
        calls["n"] = 0
        out, _ = eng({"input_ids": ids, "attention_mask": am})
        return out.detach()

    return predict


@pytest.mark.parametrize("steps,lr,sub_batch", [(1, 1e-3, 0), (1, 1e-3, 40), (3, 3e-4, 0)])
def test_logits_match_torch_ttt(shim, setup, steps, lr, sub_batch):
    """Same model, batches and masks: per-batch, Adam, all parameters -> logits within 1e-4 (fp32, CPU),
    on two consecutive batches (so the restore between units is covered too)."""
    model, tok, ids, am = setup
    masker = RowHashMasker(0.3, special_token_ids(tok), seed=5)
    ref = _reference(shim, model, tok, masker, steps, lr)
    ours = MaskedTTT(model, tok.mask_token_id, special_token_ids(tok),
                     EngineSettings(mask_prob=0.3, steps=steps, lr=lr, optimizer="adam", params="all",
                                 unit="batch", sub_batch_tokens=sub_batch), mask_fn=masker)
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        plain = model(ids, am)
    for batch in (slice(0, 4), slice(1, 3)):
        r, o = ref(ids[batch], am[batch]), ours.predict(ids[batch], am[batch])
        assert (r - o).abs().max().item() <= 1e-4
        # the adaptation must move the logits far beyond the tolerance, or the test proves nothing
        assert (r - plain[batch]).abs().max().item() > 1e-2
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_reference_mask_matches_ours(shim, setup):
    """The injected reference mask and ours skip the same tokens torch-ttt skips (PAD/CLS/SEP)."""
    model, tok, ids, am = setup
    masker = RowHashMasker(0.5, special_token_ids(tok), seed=1)
    mask = masker(ids, am, 0)
    special = torch.isin(ids, torch.tensor(special_token_ids(tok)))
    assert not (mask & special).any() and not (mask & ~am.bool()).any() and mask.any()
