"""The family registry: one name -> one corruption, in a stable order so
that tables, sweeps and CLI listings come out the same everywhere."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Literal, Optional

from ttt_pipeline.corruption import characters, external, misspellings, punctuation, tutorial, words

__all__ = ["Family", "FAMILIES", "SEVERITY_RATES", "list_families", "get_family"]

# Severity = the exact fraction of eligible units (chars or words) changed.
SEVERITY_RATES: dict[int, float] = {1: 0.02, 2: 0.05, 3: 0.10, 4: 0.20, 5: 0.30}

ApplyFn = Callable[[str, float, random.Random], "tuple[str, int, int]"]


@dataclass(frozen=True)
class Family:
    """A corruption family.

    ``apply(text, rate, rng) -> (new_text, n_edits, n_eligible)``.
    ``fixed_stream`` is set only for families that ignore severity (the
    tutorial composite): the per-text rng is then keyed by it instead of the
    severity, so every severity yields the very same texts.
    """

    name: str
    unit: Literal["char", "word"]
    description: str
    apply: ApplyFn
    fixed_stream: Optional[str] = None

    @property
    def uses_severity(self) -> bool:
        return self.fixed_stream is None

    @property
    def external(self) -> bool:
        """Written by another library (`ext:` families): the held-out test, never used to choose a defense."""
        return external.is_external(self.name)


def _registry(*fams: Family) -> dict[str, Family]:
    return {f.name: f for f in fams}


FAMILIES: dict[str, Family] = _registry(
    Family("char_swap", "char", "swap a character with the next one inside a word (tutorial op)",
           characters.char_swap),
    Family("char_drop", "char", "delete characters (tutorial op)", characters.char_drop),
    Family("char_repeat", "char", "double characters (tutorial op)", characters.char_repeat),
    Family("word_delete", "word", "delete words (tutorial op; never the last remaining word)",
           words.word_delete),
    Family("word_shuffle", "word", "shuffle inner letters of words with >= 4 letters, first/last kept (tutorial op)",
           words.word_shuffle),
    Family("keyboard", "char", "replace letters/digits with a QWERTY neighbour", characters.keyboard),
    Family("char_insert", "char", "insert a random letter next to a character", characters.char_insert),
    Family("ocr", "char", "OCR glyph confusions: rn<->m, l->1, I->l, O<->0, e->c, S->5, cl->d, vv->w, ...",
           characters.ocr),
    Family("case", "char", "flip the case of letters", characters.case_noise),
    Family("word_repeat", "word", "write a word twice", words.word_repeat),
    Family("word_swap", "word", "swap two adjacent (different) words", words.word_swap),
    Family("punctuation", "char",
           "punctuation/whitespace noise: drop or insert marks, doubled spaces, missing space after punctuation",
           punctuation.punctuation_noise),
    Family("tutorial", "word",
           "torch-ttt BERT tutorial composite at its own probabilities (char 0.1, word 0.1); "
           "severity is recorded but ignored; rate = fraction of words changed",
           tutorial.tutorial_family,
           fixed_stream=tutorial.stream_key(tutorial.TUTORIAL_CHAR_PROB, tutorial.TUTORIAL_WORD_PROB)),
    Family("misspelling", "word",
           "real human misspellings (recieve, definately, becuase) from codespell's list of Wikipedia's common "
           "misspellings; rate = share of the words that list covers", misspellings.misspelling),
    *(Family(name, "word", f"external: nlpaug {cls} (optional extra `external`); rate = share of words altered",
             external.external_family(name)) for name, (_, cls, _) in external.EXTERNAL.items()),
)


def list_families(external_ones: bool = True) -> list[str]:
    """Every family name; `external_ones=False`: the project's own suite only (no `ext:` family)."""
    return [name for name, fam in FAMILIES.items() if external_ones or not fam.external]


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown corruption family {name!r}; valid families: "
                         f"{', '.join(FAMILIES)}") from None
