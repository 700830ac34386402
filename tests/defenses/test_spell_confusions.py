"""spell's optional `confusions` fix: rewrites learned from codespell's list of real misspellings (issue 36)."""

from __future__ import annotations

from ttt_pipeline.defenses.spell import CONFUSION_MIN_COUNT, DEFAULT_FIXES, SpellRepair, _confusions


def test_learned_rewrites_are_patterns_seen_often_and_longer_than_one_letter():
    rules = _confusions()
    assert 100 < len(rules) < 2000
    assert "l" in rules["ll"]  # a doubled letter written once is among the commonest real errors
    assert all(max(len(w), len(m)) >= 2 for w, ms in rules.items() for m in ms)
    assert CONFUSION_MIN_COUNT == 10


def test_off_by_default_and_known_words_stay():
    assert "confusions" not in DEFAULT_FIXES
    repair = SpellRepair(fixes=(*DEFAULT_FIXES, "confusions"))
    text = "The battery lasts a long time, great value."
    assert repair.repair(text) == text
    assert repair.repair("a seperate ocasion") == "a separate occasion"
    assert repair.repair("a seperate ocasion") == "a separate occasion"  # from the caches: the same answer
