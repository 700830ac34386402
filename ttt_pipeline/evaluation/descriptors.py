"""Label-free descriptors of review text, per review and per window of traffic (issue 69).

Production traffic has no labels, so what a window of it costs in accuracy is forecast (evaluation.forecast) from
what can be measured on the text and on the model's outputs alone. Per review (`text_descriptors`):

- `text_length`: characters; `word_count`: words, cut as `spell` cuts them (defenses.vocabulary.words);
- `oov_words_share`: share of the words not in the training vocabulary (or in an optional second dictionary,
  e.g. the spell repair's English word list);
- `repaired_words_share`: share of the raw words the repair changed (`_changed_words`);
- `non_letter_character_share`: share of the non-whitespace characters that are not letters;
- `foreign_script_share`: share of the letters whose Unicode script is outside the training data's
  (`training_scripts`).

A text without words (or letters, or non-whitespace characters) has share 0 for that measure: nothing in it is
out of vocabulary, repaired or foreign, and a window's mean stays defined. All measures take linear time in the
text (regular expressions and counters; a script is looked up once per distinct character).

Per window (`window_descriptors`, `window_from_sums`): the means of the per-review descriptors, the mean top-class
probability, the share of predictions the defense changed, the predicted label shares and their total variation
distance from a reference's. Every window figure is a sum over reviews divided by a count, so a query that streams
over millions of records (DuckDB: `sum(oov_words_share)`, `count(*) FILTER (WHERE pred_raw <> pred_repaired)`, ...)
feeds `window_from_sums` without materialising per-review arrays; `window_descriptors` is exactly
`window_from_sums(window_sums(...))`.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections import Counter
from typing import Container, Iterable, Mapping, Sequence

import numpy as np

from ttt_pipeline.defenses.vocabulary import words

PER_TEXT = ("text_length", "word_count", "oov_words_share", "repaired_words_share", "non_letter_character_share",
            "foreign_script_share")
# Our name -> Evidently's descriptor of the same measure (evidently.descriptors). Evidently reports its shares in
# percent, ours are fractions; its OOV reads NLTK's English word list (lemmatised), ours the training vocabulary;
# its non-letter share divides by all characters, spaces included, ours by the non-whitespace ones (a review's
# spacing is no noise). repaired_words_share and foreign_script_share have no Evidently counterpart.
EVIDENTLY_NAMES = {
    "text_length": "TextLength",
    "word_count": "WordCount",
    "oov_words_share": "OOVWordsPercentage",  # "OOV Words %"
    "non_letter_character_share": "NonLetterCharacterPercentage",  # "Non Letter Character %"
}
MIN_SCRIPT_SHARE = 0.01  # training_scripts: a script with fewer of the training letters is not one of its scripts

_ASCII_LETTER = re.compile(r"[A-Za-z]")
# Word characters less ASCII letters, decimal digits and underscore: the other scripts' letters, and a few numeric
# signs (², ½) that str.isalpha sorts out per distinct character.
_OTHER_LETTER = re.compile(r"(?![A-Za-z])[^\W\d_]")
_SPACE = re.compile(r"\s")
_WIDTH = frozenset({"FULLWIDTH", "HALFWIDTH"})  # FULLWIDTH LATIN CAPITAL LETTER A is Latin


@functools.lru_cache(maxsize=65536)
def script(ch: str) -> str:
    """A letter's script, cheaply: the first word of its Unicode name (LATIN, CYRILLIC, GREEK, ARABIC, HIRAGANA,
    KATAKANA, HANGUL, CJK for the unified ideographs, ...; a full/half-width form counts as its base script).
    Not the Unicode Script property (unicodedata has none), but it separates the scripts that matter here; an
    unnamed character is UNKNOWN."""
    parts = unicodedata.name(ch, "UNKNOWN").split()
    return parts[1] if parts[0] in _WIDTH and len(parts) > 1 else parts[0]


def script_counts(text: str) -> Counter:
    """script -> number of letters (str.isalpha) of that script in the text, ASCII letters counted in bulk."""
    counts: Counter = Counter()
    ascii_letters = len(_ASCII_LETTER.findall(text))
    if ascii_letters:
        counts["LATIN"] = ascii_letters
    for ch, n in Counter(_OTHER_LETTER.findall(text)).items():
        if ch.isalpha():
            counts[script(ch)] += n
    return counts


def training_scripts(texts: Iterable[str], min_share: float = MIN_SCRIPT_SHARE) -> frozenset[str]:
    """The scripts of at least `min_share` of the training texts' letters: the reference of foreign_script_share
    (a few borrowed names in another script do not make it one of the training data's)."""
    total: Counter = Counter()
    for text in texts:
        total.update(script_counts(_checked(text, 0)))
    letters = sum(total.values())
    return frozenset(s for s, n in total.items() if letters and n / letters >= min_share)


def _checked(text: object, i: int) -> str:
    if not isinstance(text, str):
        raise TypeError(f"text {i} is {type(text).__name__}, not str: drop or fill missing texts first")
    return text


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def _changed_words(raw: list[str], repaired: list[str]) -> int:
    """How many of the raw words the repair changed. `spell` replaces a word by one word in place, so with as many
    words on both sides the lists align position by position (exact). A repair that merges or splits words shifts
    them; then the count is the raw words the repaired text lacks (multiset difference, linear and order-free):
    the same count whenever no word of the text is both a repair's output and another's input. difflib's alignment
    is quadratic in the worst case, too slow for a 1 MB review."""
    if len(raw) == len(repaired):
        return sum(a != b for a, b in zip(raw, repaired))
    lacking = Counter(raw)
    lacking.subtract(repaired)
    return sum(n for n in lacking.values() if n > 0)


def _one(text: str, repaired: str | None, vocabulary: Container[str], dictionary: Container[str] | None,
         scripts: Container[str]) -> tuple[float, ...]:
    ws = words(text)
    oov = sum(1 for w in ws if w not in vocabulary and (dictionary is None or w not in dictionary))
    changed = _changed_words(ws, words(repaired)) if repaired is not None else 0
    visible = len(text) - len(_SPACE.findall(text))
    letters = script_counts(text)
    n_letters = sum(letters.values())
    foreign = sum(n for s, n in letters.items() if s not in scripts)
    return (len(text), len(ws), _share(oov, len(ws)), _share(changed, len(ws)),
            _share(visible - n_letters, visible), _share(foreign, n_letters))


def text_descriptors(texts: Sequence[str], repaired: Sequence[str] | None, vocabulary: Container[str],
                     scripts: Container[str], dictionary: Container[str] | None = None) -> dict[str, np.ndarray]:
    """PER_TEXT name -> one float per text. `repaired`: the same texts after the default repair (None: no repair,
    and no `repaired_words_share`); `vocabulary`: the training vocabulary (defenses.vocabulary.training_vocabulary,
    a dict or a set of lowercased words); `dictionary`: words known besides it (None: the vocabulary alone);
    `scripts`: the training data's scripts (training_scripts)."""
    if repaired is not None and len(repaired) != len(texts):
        raise ValueError(f"{len(repaired)} repaired texts for {len(texts)} texts")
    rows = [_one(_checked(t, i), None if repaired is None else _checked(repaired[i], i), vocabulary, dictionary,
                 scripts) for i, t in enumerate(texts)]
    table = np.asarray(rows, dtype=float).reshape(len(rows), len(PER_TEXT))
    out = {name: table[:, j] for j, name in enumerate(PER_TEXT)}
    if repaired is None:
        del out["repaired_words_share"]
    return out


def window_sums(per_text: Mapping[str, np.ndarray], probs, preds_raw=None, preds_repaired=None,
                threshold: float | None = None) -> tuple[dict, int]:
    """(sums, n): what `window_from_sums` reads, from per-review arrays; a database query computes the same sums.
    sums: each per-text descriptor's sum; `confidence` the sum of top-class probabilities; `label_counts` the
    reviews per predicted class (argmax of `probs`); `changed_predictions` the reviews whose raw and repaired
    predictions differ (both given only); `above_threshold` the reviews whose top-class probability exceeds
    `threshold` (ATC's count, forecast.baseline_drops; given only)."""
    p = np.asarray(probs, dtype=float)
    if p.ndim != 2:
        raise ValueError(f"probs must be (reviews, classes), got shape {p.shape}")
    n = p.shape[0]
    for name, values in per_text.items():
        if len(values) != n:
            raise ValueError(f"{name}: {len(values)} values for {n} reviews")
    top = p.max(axis=1) if n else np.zeros(0)
    sums: dict = {name: float(np.sum(values)) for name, values in per_text.items()}
    sums["confidence"] = float(top.sum())
    sums["label_counts"] = np.bincount(p.argmax(axis=1), minlength=p.shape[1]).tolist() if n else [0] * p.shape[1]
    if (preds_raw is None) != (preds_repaired is None):
        raise ValueError("defense_change_rate needs both preds_raw and preds_repaired, or neither")
    if preds_raw is not None:
        raw, fixed = np.asarray(preds_raw), np.asarray(preds_repaired)
        if raw.shape != (n,) or fixed.shape != (n,):
            raise ValueError(f"preds_raw {raw.shape} and preds_repaired {fixed.shape} must both be ({n},)")
        sums["changed_predictions"] = int(np.sum(raw != fixed))
    if threshold is not None:
        sums["threshold"] = float(threshold)
        sums["above_threshold"] = int(np.sum(top > threshold))
    return sums, n


def total_variation(p: Sequence[float], q: Sequence[float]) -> float:
    """Half the L1 distance between two distributions over the same classes."""
    if len(p) != len(q):
        raise ValueError(f"label shares over {len(p)} and {len(q)} classes")
    return 0.5 * float(sum(abs(a - b) for a, b in zip(p, q)))


def window_from_sums(sums: Mapping, n: int, reference_label_shares: Sequence[float] | None = None) -> dict:
    """A window's descriptors from its sums (`window_sums`' keys; a database's `sum`/`count` columns do) over `n`
    reviews: each per-text descriptor's mean, `mean_confidence`, `defense_change_rate` (None unless the sums count
    changed predictions), `label_shares` (by predicted class index), `label_share_shift` (total variation against
    `reference_label_shares`; None without them), `share_above_threshold` with its `threshold` (when counted) and
    `n`. A window of no reviews has None for every mean and share."""
    def mean(key: str) -> float | None:
        return float(sums[key]) / n if n else None

    out: dict = {name: mean(name) for name in PER_TEXT if name in sums}
    out["mean_confidence"] = mean("confidence")
    out["defense_change_rate"] = mean("changed_predictions") if "changed_predictions" in sums else None
    counts = [int(c) for c in sums["label_counts"]]
    out["label_shares"] = [c / n for c in counts] if n else None
    out["label_share_shift"] = (total_variation(out["label_shares"], reference_label_shares)
                                if n and reference_label_shares is not None else None)
    if "above_threshold" in sums:
        out["threshold"] = float(sums["threshold"])
        out["share_above_threshold"] = mean("above_threshold")
    out["n"] = int(n)
    return out


def window_descriptors(per_text: Mapping[str, np.ndarray], probs, preds_raw=None, preds_repaired=None,
                       reference_label_shares: Sequence[float] | None = None,
                       threshold: float | None = None) -> dict:
    """A window's descriptors from per-review arrays (`text_descriptors`' output and the model's class
    probabilities): `window_from_sums(*window_sums(...))`, see there for the keys."""
    sums, n = window_sums(per_text, probs, preds_raw, preds_repaired, threshold)
    return window_from_sums(sums, n, reference_label_shares)


def finite(window: Mapping, key: str) -> float:
    """A window's figure as a float, or ValueError naming what is missing (forecast reads its inputs here)."""
    value = window.get(key)
    if value is None or not math.isfinite(float(value)):
        raise ValueError(f"the window has no {key!r} (n={window.get('n')}): its sums lack it or it holds no reviews")
    return float(value)
