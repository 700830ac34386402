"""Word-level families.  Words are maximal runs of non-whitespace; the
original whitespace between them is kept, so a word edit never also counts as
whitespace noise.  As for characters, a word is eligible only where the
family's edit can really change the text.
"""

from __future__ import annotations

import random
import re

from ttt_pipeline.corruption.graphemes import units
from ttt_pipeline.corruption.rng import edit_count, pick, pick_spaced

__all__ = ["word_delete", "word_shuffle", "word_repeat", "word_swap"]

Result = tuple[str, int, int]

_WS = re.compile(r"(\s+)")
_CORE = re.compile(r"^(\W*)(.*?)(\W*)$", re.S)


def _split(text: str) -> tuple[list[str], list[int]]:
    """parts alternates word, whitespace, word...; returns it and the indices
    of the non-empty words (only the two ends can be empty)."""
    parts = _WS.split(text)
    return parts, [j for j in range(0, len(parts), 2) if parts[j]]


def word_delete(text: str, rate: float, rng: random.Random) -> Result:
    """Drop words together with one adjacent separator; never the last word
    standing, so no text becomes empty."""
    parts, words = _split(text)
    n = len(words)
    k = min(edit_count(rate, n, rng), max(n - 1, 0))
    chosen = set(pick(rng, words, k))
    if not chosen:
        return text, 0, n
    lead = parts[1] if parts[0] == "" and len(parts) > 1 else ""
    trail = parts[-2] if parts[-1] == "" and len(parts) > 1 else ""
    out = [lead]
    prev = -1
    for j in words:
        if j in chosen:
            continue
        if prev >= 0:
            out.append(parts[prev + 1])  # the whitespace that followed the previous kept word
        out.append(parts[j])
        prev = j
    out.append(trail)
    return "".join(out), len(chosen), n


def _core(word: str) -> tuple[str, str, str]:
    """Split off leading/trailing punctuation so 'first/last letter kept' means letters."""
    if word.isalnum():
        return "", word, ""
    m = _CORE.match(word)
    assert m is not None  # the pattern matches every string
    return m.group(1), m.group(2), m.group(3)


def word_shuffle(text: str, rate: float, rng: random.Random) -> Result:
    """Scramble inner letters, keeping the first and last (the tutorial's
    shuffle).  Only words of >= 4 letters whose inner letters are not all
    equal are eligible, and a shuffle that reproduces the word is redrawn, so
    every counted edit is a visible change."""
    parts, words = _split(text)
    cands: list[int] = []
    split: dict[int, tuple[str, list[str], str]] = {}
    for j in words:
        pre, core, post = _core(parts[j])
        cu = list(core) if core.isascii() else units(core)
        if len(cu) < 4:
            continue
        mid = cu[1:-1]
        m0 = mid[0]
        if all(x == m0 for x in mid):
            continue
        cands.append(j)
        split[j] = (pre, cu, post)
    chosen = pick(rng, cands, edit_count(rate, len(cands), rng))
    for j in chosen:
        pre, cu, post = split[j]
        mid = cu[1:-1]
        new = mid[:]
        while new == mid:  # terminates: at least two distinct inner letters
            rng.shuffle(new)
        parts[j] = pre + cu[0] + "".join(new) + cu[-1] + post
    return "".join(parts), len(chosen), len(cands)


def word_repeat(text: str, rate: float, rng: random.Random) -> Result:
    """Stutter: a word written twice."""
    parts, words = _split(text)
    chosen = pick(rng, words, edit_count(rate, len(words), rng))
    for j in chosen:
        parts[j] = parts[j] + " " + parts[j]
    return "".join(parts), len(chosen), len(words)


def word_swap(text: str, rate: float, rng: random.Random) -> Result:
    """Swap neighbouring words.  Pairs of identical words are not eligible
    (swapping them changes nothing), and chosen pairs never overlap, so two
    swaps cannot undo or chain into each other."""
    parts, words = _split(text)
    cands = [t for t in range(len(words) - 1) if parts[words[t]] != parts[words[t + 1]]]
    chosen = pick_spaced(rng, cands, edit_count(rate, len(cands), rng), span=2)
    for t in chosen:
        a, b = words[t], words[t + 1]
        parts[a], parts[b] = parts[b], parts[a]
    return "".join(parts), len(chosen), len(cands)
