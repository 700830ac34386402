"""Real human misspellings: the `misspelling` family (recieve, definately, seperate, becuase, teh).

Source: the misspelling list shipped by the `codespell` package (maintained; a core dependency),
`codespell_lib/data/dictionary.txt`, "derived from Wikipedia's Lists of common misspellings/For machines"
(the dictionary files are released under CC BY-SA 3.0; codespell's code is GPL-2.0-only). It is read from the
installed package at run time and never copied into this repository.

Entries used: one misspelling with exactly one correction, both lower-case ASCII words of 2+ letters (an entry
with several corrections, `alot->a lot, allot,`, is ambiguous and left out). The family swaps a correct word
for one of its listed misspellings: a word is eligible when its letters (punctuation around it kept) are a
listed correction written in plain case (lower, Capitalised, UPPER); the misspelling is re-cased like it. The
severity's rate is the exact share of eligible words changed (`rng.edit_count`), as for the other families.
"""

from __future__ import annotations

import random
import re
from functools import lru_cache
from importlib import resources

from ttt_pipeline.corruption.rng import edit_count, pick

__all__ = ["misspelling", "misspelling_table", "SOURCE"]

SOURCE = "codespell_lib/data/dictionary.txt (Wikipedia's Lists of common misspellings; CC BY-SA 3.0)"
_ENTRY = re.compile(r"([a-z]{2,})->([a-z]{2,})")
_WS = re.compile(r"(\s+)")
_CORE = re.compile(r"^(\W*)(\w+?)(\W*)$")

Result = tuple[str, int, int]


@lru_cache(maxsize=1)
def misspelling_table() -> dict[str, tuple[str, ...]]:
    """correct word -> its listed misspellings (sorted: the order never depends on the process)."""
    out: dict[str, set[str]] = {}
    with resources.as_file(resources.files("codespell_lib") / "data" / "dictionary.txt") as path:
        with open(path, encoding="utf-8") as f:
            for line in f:
                m = _ENTRY.fullmatch(line.strip())
                if m and m.group(1) != m.group(2):
                    out.setdefault(m.group(2), set()).add(m.group(1))
    return {word: tuple(sorted(wrong)) for word, wrong in sorted(out.items())}


def _recase(word: str, wrong: str) -> str:
    if word.isupper() and len(word) > 1:
        return wrong.upper()
    return wrong[:1].upper() + wrong[1:] if word[0].isupper() else wrong


def _plain(core: str) -> bool:
    return core.islower() or core.isupper() or (core[0].isupper() and core[1:].islower())


def misspelling(text: str, rate: float, rng: random.Random) -> Result:
    """Replace an exact share of the eligible words by a real misspelling of them (module docstring)."""
    table = misspelling_table()
    parts = _WS.split(text)
    cands: list[int] = []
    split: dict[int, tuple[str, str, str]] = {}
    for j in range(0, len(parts), 2):
        m = _CORE.match(parts[j])
        if m is None:
            continue
        core = m.group(2)
        if core.isascii() and core.isalpha() and _plain(core) and core.lower() in table:
            cands.append(j)
            split[j] = (m.group(1), core, m.group(3))
    chosen = pick(rng, cands, edit_count(rate, len(cands), rng))
    for j in sorted(chosen):
        pre, core, post = split[j]
        parts[j] = pre + _recase(core, rng.choice(table[core.lower()])) + post
    return "".join(parts), len(chosen), len(cands)
