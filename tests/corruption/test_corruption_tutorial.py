"""The tutorial composite replays torch-ttt's "Test-Time Training with BERT"
corruption draw for draw: words first (delete/shuffle), then characters
(swap/drop/repeat), consulting the generator in the same order."""

from __future__ import annotations

import random

import pytest

from ttt_pipeline.corruption import corrupt_texts, tutorial_corrupt
from ttt_pipeline.corruption.tutorial import apply_tutorial


class ScriptedRng:
    """Plays back a script of draws and fails on any draw the script did not expect."""

    def __init__(self, script):
        self.script = list(script)
        self.choices_seen = []

    def _next(self, kind):
        assert self.script, f"unexpected extra draw: {kind}"
        got_kind, value = self.script.pop(0)
        assert got_kind == kind, f"expected a {got_kind} draw, got {kind}"
        return value

    def random(self):
        return self._next("random")

    def choice(self, seq):
        self.choices_seen.append(tuple(seq))
        return seq[self._next("choice")]

    def shuffle(self, x):
        self._next("shuffle")
        x.reverse()


HIT, MISS = ("random", 0.05), ("random", 0.5)


def test_order_of_operations_matches_the_tutorial():
    script = [
        # word pass over "abcde fg hij"
        HIT, ("choice", 1), ("shuffle", None),   # abcde -> shuffle inner -> adcbe
        HIT, ("choice", 1),                        # fg: shuffle chosen but len <= 3 -> unchanged, no draw
        HIT, ("choice", 0),                        # hij: deleted
        # char pass over "adcbe fg"
        MISS, HIT, ("choice", 0), MISS, HIT, ("choice", 2), MISS,  # swap at 1 -> acdbe; repeat at 3 -> acdbbe
        HIT, ("choice", 1), HIT, ("choice", 0),    # fg: drop f; swap at the last index is a no-op
    ]
    rng = ScriptedRng(script)
    out, changed, n = apply_tutorial("abcde fg hij", 0.1, 0.1, rng)
    assert rng.script == []
    assert out == "acdbbe g"
    assert (changed, n) == (3, 3)
    # the op lists are the tutorial's, in the tutorial's order (choice draws an index into them)
    assert set(rng.choices_seen) == {("delete", "shuffle"), ("swap", "drop", "repeat")}


def test_probabilities_are_per_word_then_per_char():
    text = "one two three four five six seven eight nine ten " * 20
    # all words hit: each is deleted or shuffled, none survives as-is unless shuffle could not change it
    out, changed, n = apply_tutorial(text, 0.0, 1.0, random.Random(0))
    assert len(out.split()) < n and changed >= n - sum(len(w) <= 3 for w in text.split())
    # only chars: word count kept, every char hit
    out, changed, n = apply_tutorial(text, 1.0, 0.0, random.Random(0))
    assert len(out.split(" ")) == n and changed > 0.8 * n


def test_tutorial_corrupt_defaults_rates_and_seeding():
    texts = ["This is an example of a clean sentence", "", "x", "naïve 😀 café"] * 3
    a = tutorial_corrupt(texts, seed=1)
    assert a == tutorial_corrupt(texts, 0.1, 0.1, seed=1)
    assert a.texts == corrupt_texts(texts, "tutorial", 4, 1).texts
    assert (a.family, a.severity, a.seed) == ("tutorial", 0, 1)
    assert a.texts[0] == a.texts[4] and a.texts[1] == ""
    assert a.n_eligible == 3 * (8 + 0 + 1 + 3)
    assert a.realised_edit_rate == pytest.approx(a.n_edits / a.n_eligible)
    heavier = tutorial_corrupt(texts * 10, char_prob=0.3, word_prob=0.3, seed=1)
    assert heavier.realised_edit_rate > tutorial_corrupt(texts * 10, seed=1).realised_edit_rate
    assert tutorial_corrupt(texts, seed=2).texts != a.texts
