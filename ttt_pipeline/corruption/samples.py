"""Review-like English text for tests and benchmarks when the real MDSD
reviews are not around: varied word lengths, capitals, digits and
punctuation, so every family has something to bite on."""

from __future__ import annotations

import random

__all__ = ["synthetic_reviews"]

_VOCAB = (
    "the a an and but or so because this that these those it its i my we our you your they them "
    "product item device camera battery charger cable screen speaker headphones keyboard mouse "
    "laptop tablet phone remote player radio printer router adapter case cover manual warranty "
    "sound quality picture price value delivery shipping seller support replacement refund "
    "works worked stopped broke arrived returned bought ordered recommend love hate like expected "
    "great good excellent terrible awful poor cheap solid sturdy flimsy easy difficult simple "
    "really very quite extremely barely never always sometimes after before within during "
    "would could should will can cannot does doesn't didn't isn't wasn't won't it's i've "
    "minutes hours days weeks months year time money problem issue design feature setup "
    "comfortable reliable disappointed satisfied impressed frustrating amazing horrible "
    "Amazon Sony Samsung Logitech Apple Bluetooth USB HDMI Windows"
).split()
_ENDS = (".", ".", ".", "!", "?")


def synthetic_reviews(n: int, seed: int = 0, min_words: int = 80, max_words: int = 140) -> list[str]:
    """n single-line pseudo-reviews (~110 words each by default)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        target = rng.randint(min_words, max_words)
        words: list[str] = []
        sentence_start = True
        while len(words) < target:
            w = rng.choice(_VOCAB)
            if sentence_start:
                w = w[:1].upper() + w[1:]
                sentence_start = False
            r = rng.random()
            if r < 0.03:
                w = str(rng.randint(1, 500))
            elif r < 0.09:
                w += ","
            elif r < 0.17:
                w += rng.choice(_ENDS)
                sentence_start = True
            words.append(w)
        if not words[-1].endswith(_ENDS):
            words[-1] += "."
        out.append(" ".join(words))
    return out
