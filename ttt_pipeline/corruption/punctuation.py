"""Punctuation and whitespace noise: the edits a hurried typist or a sloppy
scraper makes without touching any letter.

Eligible units are the slots where at least one of these edits is possible:
a punctuation mark (drop it), a space (double it; remove it when it follows
punctuation, i.e. "missing space after punctuation") and the last character
of a word (insert a stray mark after it).  Every edit changes the text.
"""

from __future__ import annotations

import random
import string
import unicodedata

from ttt_pipeline.corruption.graphemes import units
from ttt_pipeline.corruption.rng import edit_count, pick

__all__ = ["punctuation_noise", "INSERTED_MARKS"]

INSERTED_MARKS = (",", ".", ";", ":", "!", "?", "'", "-")
_ASCII_PUNCT = frozenset(string.punctuation)


def _is_punct(c: str) -> bool:
    if c in _ASCII_PUNCT:
        return True
    return not c.isascii() and unicodedata.category(c[0]).startswith("P")


def punctuation_noise(text: str, rate: float, rng: random.Random) -> tuple[str, int, int]:
    u = units(text)
    n = len(u)
    punct = [_is_punct(c) for c in u]
    space = [c == " " for c in u]
    ops: dict[int, tuple[str, ...]] = {}
    for i, c in enumerate(u):
        if punct[i]:
            ops[i] = ("drop",)
        elif space[i]:
            ops[i] = ("double", "nospace") if i > 0 and punct[i - 1] else ("double",)
        elif not c.isspace() and (i + 1 == n or u[i + 1].isspace()):
            ops[i] = ("insert",)
    cands = list(ops)  # dict keeps index order, so this is deterministic
    chosen = pick(rng, cands, edit_count(rate, len(cands), rng))
    for i in chosen:
        op = ops[i][0] if len(ops[i]) == 1 else rng.choice(ops[i])
        if op == "drop" or op == "nospace":
            u[i] = ""
        elif op == "double":
            u[i] = "  "
        else:
            u[i] = u[i] + rng.choice(INSERTED_MARKS)
    return "".join(u), len(chosen), len(cands)
