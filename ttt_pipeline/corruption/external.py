"""External generators: noise this project did not write, from the nlpaug augmentation library (MIT licence),
as `ext:` families, so any defense can be checked on noise it was not tuned on.

nlpaug is the optional extra `external` (`pip install "ttt-pipeline[external]"`; `make setup` installs it).
Without it the families are still listed, and using one fails with an error and a hint naming the extra.

- `ext:keyboard`: nlpaug's KeyboardAug (QWERTY neighbours from its own keyboard map; letters only);
- `ext:ocr`: OcrAug (its own OCR confusion table);
- `ext:random_char`: RandomCharAug, substitute (a random letter or digit);
- `ext:spelling`: SpellingAug with the misspelling list nlpaug ships (`res/word/spelling/spelling_en.txt`,
  natural errors collected by Belinkov and Bisk 2018, github.com/ybisk/charNMT-noise): a different list from
  the `misspelling` family's, so it is a held-out test for a repair that learns from that one.

Severity: the rate (SEVERITY_RATES) is nlpaug's share of words to alter (`aug_word_p` / `aug_p`, no cap on
the count; nlpaug rounds the count up); inside a word the character augmenters keep nlpaug's defaults (30% of
the characters, 1 to 10). Words are whitespace tokens (nlpaug's own tokenizer would also re-space punctuation,
which is not the noise under test), and the text's own whitespace is kept around them. The realised rate is the
share of words that changed (a word the augmenter could not alter counts as unchanged).

Determinism: nlpaug draws from the global `random` and `numpy.random` streams; each text's call seeds both
from the text's own stream (`rng.text_rng`) and restores their previous states afterwards, and the spelling
list's candidates are sorted (nlpaug builds them through a `set`, whose order changes between processes).
"""

from __future__ import annotations

import random
import re
from functools import lru_cache

from ttt_pipeline.errors import PipelineError

__all__ = ["EXTERNAL", "EXTRA", "external_family", "is_external", "require"]

EXTRA = "external"
PREFIX = "ext:"
# family name -> (nlpaug module, class, keyword arguments besides the rate)
EXTERNAL: dict[str, tuple[str, str, dict]] = {
    "ext:keyboard": ("nlpaug.augmenter.char", "KeyboardAug",
                     {"include_special_char": False, "include_numeric": False}),
    "ext:ocr": ("nlpaug.augmenter.char", "OcrAug", {}),
    "ext:random_char": ("nlpaug.augmenter.char", "RandomCharAug", {"action": "substitute"}),
    "ext:spelling": ("nlpaug.augmenter.word", "SpellingAug", {}),
}

Result = tuple[str, int, int]
_WS = re.compile(r"(\s+)")


def is_external(family: str) -> bool:
    return str(family).startswith(PREFIX)


def require(family: str = "ext:*") -> None:
    """Raise the error/hint of a missing optional extra, naming it."""
    try:
        import nlpaug  # noqa: F401
    except ImportError:
        raise PipelineError(
            f"corruption family {family!r} needs the optional library nlpaug, which is not installed",
            hint=f'pip install "ttt-pipeline[{EXTRA}]" (or `make setup`, which installs the {EXTRA} extra)') from None


def _split(text: str) -> list[str]:
    return text.split()


def _join(tokens: list[str]) -> str:
    return " ".join(tokens)


@lru_cache(maxsize=32)
def _augmenter(family: str, rate: float):
    import importlib

    require(family)
    module, cls, extra = EXTERNAL[family]
    kind = getattr(importlib.import_module(module), cls)
    common = {"tokenizer": _split, "reverse_tokenizer": _join}
    if cls == "SpellingAug":
        aug = kind(aug_p=rate, aug_min=0, aug_max=None, **common, **extra)
        for key, values in aug.model.dict.items():  # built through a set: sort for a process-independent order
            aug.model.dict[key] = sorted(set(values))
        return aug
    return kind(aug_word_p=rate, aug_word_min=0, aug_word_max=None, **common, **extra)


def _seeded_call(aug, text: str, seed: int) -> str:
    import numpy as np

    state, np_state = random.getstate(), np.random.get_state()
    try:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        out = aug.augment(text)
    finally:
        random.setstate(state)
        np.random.set_state(np_state)
    if isinstance(out, list):
        out = out[0] if out else text
    return out


def external_family(family: str):
    """The registry's apply function of an `ext:` family: (text, rate, rng) -> (text, words changed, words)."""
    def apply(text: str, rate: float, rng: random.Random) -> Result:
        parts = _WS.split(text)
        slots = [j for j in range(0, len(parts), 2) if parts[j]]
        seed = rng.getrandbits(63)
        if not slots:
            return text, 0, 0
        words = [parts[j] for j in slots]
        after = _seeded_call(_augmenter(family, rate), " ".join(words), seed).split()
        if len(after) != len(words):  # not seen with these augmenters; the library's text as it wrote it
            new = " ".join(after)
            return new, (new != text) * max(1, abs(len(after) - len(words))), len(words)
        changed = 0
        for j, w in zip(slots, after):
            changed += parts[j] != w
            parts[j] = w
        return "".join(parts), changed, len(words)
    apply.__name__ = family.replace(":", "_")
    return apply
