"""bench/studies/repair_ceiling.py's oracle repair: the tutorial composite's word pass replayed exactly (no model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ttt_pipeline.corruption import corrupt_texts

REPO = Path(__file__).resolve().parents[2]

TEXTS = [
    "The battery lasts all day and the screen is bright enough to read outside in the sun.",
    "I returned it after a week because the sound kept cutting out whenever I walked away from the base.",
    "Great value for the price, easy to set up, and the remote works from across the room without trouble.",
    "a b c d e f g h i j k l m n o p q r s t u v w x y z",
] * 10
DISTINCT = [f"{t} ({i})" for i, t in enumerate(TEXTS)]  # distinct texts: distinct random streams


@pytest.fixture(scope="module")
def ceiling():
    from bench.studies import repair_ceiling

    return repair_ceiling


def _subsequence(part: list[str], whole: list[str]) -> bool:
    it = iter(whole)
    return all(w in it for w in part)


@pytest.mark.parametrize("seed", [7, 8, 1000])
def test_restored_keeps_every_surviving_word_as_written(ceiling, seed):
    texts = DISTINCT
    bad = corrupt_texts(texts, "tutorial", 3, seed).texts
    fixed = ceiling.restored(texts, bad, seed)
    assert all(_subsequence(f.split(), t.split()) for f, t in zip(fixed, texts))  # only deletions are left
    deleted = sum(len(t.split()) - len(f.split()) for f, t in zip(fixed, texts))
    words = sum(len(t.split()) for t in texts)
    assert 0 < deleted < 0.12 * words  # the tutorial deletes a word with probability 0.05
    assert sum(f != b for f, b in zip(fixed, bad)) > 0.9 * len(texts)  # and the corruption did alter them


def test_restored_refuses_a_corruption_it_did_not_replay(ceiling):
    bad = corrupt_texts(DISTINCT, "tutorial", 3, 7).texts
    with pytest.raises(AssertionError, match="diverged"):
        ceiling.restored(DISTINCT, bad, 8)  # another seed's deletions do not match
