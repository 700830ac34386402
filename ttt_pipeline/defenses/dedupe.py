"""dedupe: a text repair that drops a word written twice in a row (`the the battery` -> `the battery`).

It undoes the `word_repeat` corruption (a word written twice) and the stutter of fast typing. Matching is
case-insensitive on whole whitespace-separated tokens (`week, week,` -> `week,`); the first copy, its casing and everything around it are kept. A deliberate
repetition (`very very good`, `had had`) is collapsed too: that is the repair's cost on clean text, and the
evaluate step measures it beside its gain like any defense's (`clean` rows, paired against `none`).
"""

from __future__ import annotations

import re
from typing import Callable

_REPEAT = re.compile(r"(?<!\S)(\S+)(?:\s+\1)+(?!\S)", re.IGNORECASE)  # a whitespace token, its punctuation too


def dedupe(text: str) -> str:
    """`the the battery` -> `the battery`: each run of a repeated word keeps its first copy."""
    return _REPEAT.sub(r"\1", text)


def build(settings, context: dict) -> Callable[[list[str]], list[str]]:
    """The registry's constructor for a text repair (no settings of its own)."""
    return lambda texts: [dedupe(t) for t in texts]
