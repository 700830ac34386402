"""dedupe: a text repair that drops a word written twice in a row (`the the battery` -> `the battery`).

It undoes the `word_repeat` corruption (a word written twice) and the stutter of fast typing. Matching is on whole
whitespace-separated tokens (`week, week,` -> `week,`), case-insensitive unless `ttt.dedupe.ignore_case` is false;
the first copy, its casing and everything around it are kept. A deliberate repetition (`very very good`, `had
had`) is collapsed too: that is the repair's cost on clean text, and the evaluate step measures it beside its gain
like any defense's (`clean` rows, paired against `none`).
"""

from __future__ import annotations

import re
from typing import Callable

from pydantic import Field

from ttt_pipeline.defenses.settings import DefenseSettings

_REPEAT = r"(?<!\S)(\S+)(?:\s+\1)+(?!\S)"  # a whitespace token, its punctuation too, then its copies
_PATTERNS = {True: re.compile(_REPEAT, re.IGNORECASE), False: re.compile(_REPEAT)}


class Settings(DefenseSettings):
    """`ttt.dedupe.*`."""

    ignore_case: bool = Field(True, description="A word and its copy match whatever their case (`The the` -> "
                              "`The`); false: only copies spelled alike.")


def dedupe(text: str, ignore_case: bool = True) -> str:
    """`the the battery` -> `the battery`: each run of a repeated word keeps its first copy."""
    return _PATTERNS[ignore_case].sub(r"\1", text)


def build(settings: Settings, context: dict) -> Callable[[list[str]], list[str]]:
    """The registry's constructor for a text repair: its own settings (`ttt.dedupe`), no context needed."""
    return lambda texts: [dedupe(t, settings.ignore_case) for t in texts]
