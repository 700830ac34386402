"""Corrupting a batch of texts, and the record of what was done to it."""

from __future__ import annotations

import hashlib
import json
import operator
from dataclasses import dataclass
from typing import Sequence

from ttt_pipeline.corruption.registry import SEVERITY_RATES, get_family
from ttt_pipeline.corruption.rng import text_rng
from ttt_pipeline.corruption.tutorial import apply_tutorial, stream_key

__all__ = ["CorruptedSet", "corrupt_texts", "tutorial_corrupt", "TUTORIAL_CORRUPT_SEVERITY"]

# tutorial_corrupt() is not a severity level; 0 marks "explicit probabilities".
TUTORIAL_CORRUPT_SEVERITY = 0


@dataclass(frozen=True)
class CorruptedSet:
    """Corrupted texts (same number and order as the input) plus the numbers
    needed to check that the requested severity was actually delivered."""

    texts: list[str]
    family: str
    severity: int
    seed: int
    n_edits: int
    n_eligible: int
    realised_edit_rate: float

    def __len__(self) -> int:
        return len(self.texts)

    def digest(self) -> str:
        """Content address for caching and provenance: equal digests mean the
        same request produced the same texts."""
        payload = json.dumps([self.family, self.severity, self.seed, list(self.texts)],
                             ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()


def _check_texts(texts: Sequence[str]) -> list[str]:
    # a bare string is a Sequence[str] too, and would be corrupted letter by letter
    if isinstance(texts, (str, bytes)):
        raise TypeError("texts must be a sequence of strings, not a single string")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] is {type(t).__name__}, not str")
    return out


def _check_int(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}") from None


def _rate(n_edits: int, n_eligible: int) -> float:
    return n_edits / n_eligible if n_eligible else 0.0


def corrupt_texts(texts: Sequence[str], family: str, severity: int, seed: int) -> CorruptedSet:
    """Apply ``family`` at ``severity`` (1-5, exact rates, see SEVERITY_RATES).

    Each text's output depends only on (text, family, severity, seed), so
    splitting, reordering or parallelising a batch never changes a text.
    """
    fam = get_family(family)
    severity = _check_int(severity, "severity")
    if severity not in SEVERITY_RATES:
        raise ValueError(f"severity must be one of {sorted(SEVERITY_RATES)}, got {severity}")
    seed = _check_int(seed, "seed")
    items = _check_texts(texts)
    rate = SEVERITY_RATES[severity]
    stream = fam.fixed_stream if fam.fixed_stream is not None else f"s{severity}"
    apply = fam.apply
    out: list[str] = []
    edits = eligible = 0
    for text in items:
        new, e, n = apply(text, rate, text_rng(seed, fam.name, stream, text))
        out.append(new)
        edits += e
        eligible += n
    return CorruptedSet(out, fam.name, severity, seed, edits, eligible, _rate(edits, eligible))


def tutorial_corrupt(texts: Sequence[str], char_prob: float = 0.1, word_prob: float = 0.1,
                     seed: int = 0) -> CorruptedSet:
    """The torch-ttt tutorial's composite at explicit probabilities.

    At the defaults it returns exactly the texts of the ``tutorial`` family
    (any severity).  The set is labelled family "tutorial", severity 0.
    """
    for name, p in (("char_prob", char_prob), ("word_prob", word_prob)):
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must be a probability in [0, 1], got {p!r}")
    seed = _check_int(seed, "seed")
    items = _check_texts(texts)
    stream = stream_key(char_prob, word_prob)
    out: list[str] = []
    edits = eligible = 0
    for text in items:
        new, e, n = apply_tutorial(text, char_prob, word_prob, text_rng(seed, "tutorial", stream, text))
        out.append(new)
        edits += e
        eligible += n
    return CorruptedSet(out, "tutorial", TUTORIAL_CORRUPT_SEVERITY, seed, edits, eligible,
                        _rate(edits, eligible))
