"""Character-level families: every function picks an exact number of eligible
units and applies an edit that is guaranteed to change the text.

Eligibility is family specific on purpose: a unit is eligible only if the
family's edit can really change it there (two equal neighbours cannot be
swapped, a digit has no case).  That keeps "n_edits / n_eligible" an honest
rate of actual changes rather than of attempted ones.  Whitespace is never an
eligible character here (the punctuation family owns whitespace noise).
"""

from __future__ import annotations

import random
import string

from ttt_pipeline.corruption.graphemes import units
from ttt_pipeline.corruption.rng import edit_count, pick, pick_spaced

__all__ = ["char_swap", "char_drop", "char_repeat", "char_insert", "keyboard", "ocr", "case_noise",
           "KEYBOARD_NEIGHBOURS", "OCR_SINGLE", "OCR_PAIRS"]

Result = tuple[str, int, int]


def _solid(u: list[str]) -> list[int]:
    return [i for i, c in enumerate(u) if not c.isspace()]


def char_swap(text: str, rate: float, rng: random.Random) -> Result:
    """Transpose adjacent characters inside a word (the tutorial's swap)."""
    u = units(text)
    cands = [i for i in range(len(u) - 1)
             if u[i] != u[i + 1] and not u[i].isspace() and not u[i + 1].isspace()]
    chosen = pick_spaced(rng, cands, edit_count(rate, len(cands), rng), span=2)
    for i in chosen:
        u[i], u[i + 1] = u[i + 1], u[i]
    return "".join(u), len(chosen), len(cands)


def _each_chosen(text: str, rate: float, rng: random.Random, edit) -> Result:
    """Replace each chosen non-space unit by edit(unit): the draws of drop and repeat (one helper, same draws)."""
    u = units(text)
    cands = _solid(u)
    chosen = pick(rng, cands, edit_count(rate, len(cands), rng))
    for i in chosen:
        u[i] = edit(u[i])
    return "".join(u), len(chosen), len(cands)


def char_drop(text: str, rate: float, rng: random.Random) -> Result:
    """Delete characters (the tutorial's drop)."""
    return _each_chosen(text, rate, rng, lambda c: "")


def char_repeat(text: str, rate: float, rng: random.Random) -> Result:
    """Double characters (the tutorial's repeat)."""
    return _each_chosen(text, rate, rng, lambda c: c * 2)


_LOWER = string.ascii_lowercase


def char_insert(text: str, rate: float, rng: random.Random) -> Result:
    """Insert a random letter beside a character, matching its case."""
    u = units(text)
    cands = _solid(u)
    chosen = pick(rng, cands, edit_count(rate, len(cands), rng))
    for i in chosen:
        c = u[i]
        new = rng.choice(_LOWER)
        if c.isupper():
            new = new.upper()
        u[i] = new + c if rng.getrandbits(1) else c + new
    return "".join(u), len(chosen), len(cands)


def _keyboard_map() -> dict[str, str]:
    """QWERTY neighbours, staggered rows: the keys a finger plausibly slips to."""
    rows = ["1234567890", "qwertyuiop", "asdfghjkl", "zxcvbnm"]
    pos = {ch: (r, c) for r, row in enumerate(rows) for c, ch in enumerate(row)}
    out: dict[str, str] = {}
    for ch, (r, c) in pos.items():
        near = []
        for dr, dc in ((0, -1), (0, 1), (-1, 0), (-1, 1), (1, -1), (1, 0)):
            rr, cc = r + dr, c + dc
            if 0 <= rr < len(rows) and 0 <= cc < len(rows[rr]):
                near.append(rows[rr][cc])
        out[ch] = "".join(near)
        if ch.isalpha():
            out[ch.upper()] = "".join(n.upper() for n in near)
    return out


KEYBOARD_NEIGHBOURS: dict[str, str] = _keyboard_map()


def keyboard(text: str, rate: float, rng: random.Random) -> Result:
    """Replace letters/digits with a QWERTY neighbour (fat-finger typos)."""
    u = units(text)
    table = KEYBOARD_NEIGHBOURS
    cands = [i for i, c in enumerate(u) if c in table]
    chosen = pick(rng, cands, edit_count(rate, len(cands), rng))
    for i in chosen:
        u[i] = rng.choice(table[u[i]])
    return "".join(u), len(chosen), len(cands)


# One glyph read as another (or as two), and two glyphs read as one.
OCR_SINGLE: dict[str, tuple[str, ...]] = {
    "l": ("1", "I", "|"), "I": ("l", "1", "|"), "1": ("l", "I"), "i": ("l", "1"),
    "O": ("0", "Q"), "0": ("O", "o"), "o": ("0",), "Q": ("O",),
    "e": ("c",), "c": ("e",), "S": ("5",), "5": ("S",), "s": ("5",),
    "B": ("8",), "8": ("B",), "g": ("9", "q"), "q": ("g",), "Z": ("2",), "2": ("Z",),
    "h": ("b", "li"), "b": ("h", "6"), "u": ("v",), "v": ("u",), "a": ("o",),
    "m": ("rn",), "w": ("vv",), "d": ("cl",), "n": ("ri",), "W": ("VV",), "M": ("IVI",),
}
OCR_PAIRS: dict[str, str] = {"rn": "m", "vv": "w", "cl": "d", "li": "h", "ri": "n", "VV": "W", "nn": "m"}
_PAIR_FIRST = frozenset(p[0] for p in OCR_PAIRS)


def ocr(text: str, rate: float, rng: random.Random) -> Result:
    """OCR glyph confusions (rn->m, m->rn, l->1, O->0, cl->d, vv->w, ...)."""
    u = units(text)
    n = len(u)
    single, pairs, first = OCR_SINGLE, OCR_PAIRS, _PAIR_FIRST
    cands = [i for i, c in enumerate(u)
             if c in single or (c in first and i + 1 < n and c + u[i + 1] in pairs)]
    # span 2: a merge consumes the next unit, and no other edit may touch it
    chosen = pick_spaced(rng, cands, edit_count(rate, len(cands), rng), span=2)
    for i in chosen:
        c = u[i]
        opts: list[tuple[int, str]] = [(1, r) for r in single.get(c, ())]
        if i + 1 < n and c + u[i + 1] in pairs:
            opts.append((2, pairs[c + u[i + 1]]))
        width, rep = rng.choice(opts)
        u[i] = rep
        if width == 2:
            u[i + 1] = ""
    return "".join(u), len(chosen), len(cands)


def case_noise(text: str, rate: float, rng: random.Random) -> Result:
    """Flip the case of cased characters (shift slips, caps-lock noise)."""
    u = units(text)
    cands = [i for i, c in enumerate(u) if c.swapcase() != c]
    chosen = pick(rng, cands, edit_count(rate, len(cands), rng))
    for i in chosen:
        u[i] = u[i].swapcase()
    return "".join(u), len(chosen), len(cands)
