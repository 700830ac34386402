"""Output depends only on (text, family, severity, seed): not on the process,
PYTHONHASHSEED, batch order or batch size; different seeds differ."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ttt_pipeline.corruption import FAMILIES, SEVERITY_RATES, corrupt_texts, tutorial_corrupt
from ttt_pipeline.corruption.samples import synthetic_reviews

REPO = Path(__file__).resolve().parents[2]
TEXTS = synthetic_reviews(12, seed=3, min_words=50, max_words=90) + [
    "", "a", "naïve café 😀 日本語", "e\u0301 👨\u200d👩\u200d👧 🇫🇷", "Hello, World! rn cl vv"]

_CHILD = r"""
import json, sys
from ttt_pipeline.corruption import FAMILIES, corrupt_texts, tutorial_corrupt
texts = json.loads(sys.stdin.read())
out = {f"{f}/{s}": corrupt_texts(texts, f, s, 17).texts for f in FAMILIES for s in (1, 3, 5)}
out["tutorial_corrupt"] = tutorial_corrupt(texts, 0.2, 0.05, seed=17).texts
print(json.dumps(out))
"""


def _here() -> dict:
    out = {f"{f}/{s}": corrupt_texts(TEXTS, f, s, 17).texts for f in FAMILIES for s in (1, 3, 5)}
    out["tutorial_corrupt"] = tutorial_corrupt(TEXTS, 0.2, 0.05, seed=17).texts
    return out


def _child(hashseed: str) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": hashseed, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(TEXTS), capture_output=True,
                          text=True, encoding="utf-8", env=env, cwd=REPO, timeout=120, check=True)
    return json.loads(proc.stdout)


def test_identical_across_processes_and_hash_seeds():
    here = _here()
    a, b = _child("1"), _child("4242")
    assert a == b == here
    # sanity: the comparison is not vacuous
    assert here["char_drop/5"] != TEXTS


def test_same_call_twice_is_identical():
    for fam in FAMILIES:
        assert corrupt_texts(TEXTS, fam, 4, 1) == corrupt_texts(TEXTS, fam, 4, 1)


def test_independent_of_order_and_batching():
    order = list(range(len(TEXTS)))
    random.Random(0).shuffle(order)
    for fam in FAMILIES:
        full = corrupt_texts(TEXTS, fam, 3, 5).texts
        shuffled = corrupt_texts([TEXTS[i] for i in order], fam, 3, 5).texts
        assert shuffled == [full[i] for i in order]
        halves = corrupt_texts(TEXTS[:7], fam, 3, 5).texts + corrupt_texts(TEXTS[7:], fam, 3, 5).texts
        assert halves == full


def test_different_seeds_and_severities_give_different_outputs():
    long_texts = TEXTS[:12]
    for fam in FAMILIES:
        outs = {tuple(corrupt_texts(long_texts, fam, 3, seed).texts) for seed in range(5)}
        assert len(outs) == 5, fam
        for text in long_texts:  # per text too, not just somewhere in the batch
            assert corrupt_texts([text], fam, 3, 0).texts != corrupt_texts([text], fam, 3, 1).texts
        if FAMILIES[fam].uses_severity:
            sevs = {tuple(corrupt_texts(long_texts, fam, s, 0).texts) for s in SEVERITY_RATES}
            assert len(sevs) == 5, fam


_unicode = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=60)
_wordy = st.lists(st.sampled_from(["the", "rn", "clock", "Hello,", "naïve", "日本", "e\u0301", "😀",
                                   "vv", "I", "O0", "book", "  ", "\t", "word.", "!", "a"]),
                  max_size=25).map(" ".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(_unicode, _wordy), family=st.sampled_from(list(FAMILIES)),
       severity=st.integers(1, 5), seed=st.integers(-2**40, 2**40))
def test_property_any_text_any_family(text, family, severity, seed):
    cs = corrupt_texts([text, text], family, severity, seed)
    assert len(cs.texts) == 2 and cs.texts[0] == cs.texts[1]
    out = cs.texts[0]
    out.encode("utf-8")
    assert 0 <= cs.n_edits <= cs.n_eligible
    assert 0.0 <= cs.realised_edit_rate <= 1.0
    assert corrupt_texts([text], family, severity, seed).texts == [out]
    if FAMILIES[family].uses_severity:
        # an edit is always a real change, and no edit means no change at all
        assert (out != text) == (cs.n_edits > 0)


@settings(max_examples=100, deadline=None)
# exact counts: not the tutorial (nominal probabilities) nor the external generators (their own sampling)
@given(text=st.one_of(_unicode, _wordy),
       family=st.sampled_from([f for f in FAMILIES if f != "tutorial" and not FAMILIES[f].external]),
       rate=st.floats(0.0, 1.0), seed=st.integers(0, 2**32))
def test_property_exact_count_at_any_rate(text, family, rate, seed):
    new, n_edits, n_eligible = FAMILIES[family].apply(text, rate, random.Random(seed))
    assert n_edits <= n_eligible
    # within one edit of rate * eligible, except where non-overlap or "keep one word" makes it impossible
    if family not in ("char_swap", "ocr", "word_swap", "word_delete"):
        assert abs(n_edits - rate * n_eligible) < 1.0 + 1e-9
    assert (new != text) == (n_edits > 0)
