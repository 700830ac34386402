"""The word lists `spell` reads: symspellpy's shipped English dictionary and bigram counts, each loaded once per
process, and what is derived from them once (anagram keys, real-word rewrites, bare contractions, the spellings with
runs written once), plus the misspelling patterns learned from codespell's list and the digits that stand for
letters (`glyphs`)."""

from __future__ import annotations

import math
import re
import sys
from collections import Counter
from functools import lru_cache
from importlib import resources

from symspellpy import SymSpell

DICTIONARY = "frequency_dictionary_en_82_765.txt"
_PREFIX_LENGTH = 7  # symspellpy's prefix length for every search here (its default)
BIGRAMS = "frequency_bigramdictionary_en_243_342.txt"
# Count given to training-vocabulary words: above ~90% of the dictionary (so a product name wins a tie with
# a rare dictionary word) but far below function words (the: 2.3e10), which must keep winning their ties.
EXTRA_COUNT = 10_000_000
REAL_WORD_MAX_COUNT = 10_000_000  # real_word only rewrites dictionary words rarer than this ...
REAL_WORD_RATIO = 1000  # ... into an anagram at least this many times more frequent
CONFUSION_MIN_COUNT = 10  # `confusions`: a rewrite is learned when at least this many listed misspellings show it
_RUN = re.compile(r"(.)\1+")  # a letter written more than once in a row (_singled)


@lru_cache(maxsize=1)
def _confusions() -> dict[str, tuple[str, ...]]:
    """What real misspellings look like, learned from codespell's list of Wikipedia's common misspellings
    (ttt_pipeline.corruption.misspellings): each differing segment of a misspelling and its correction (difflib
    over letters; an insertion or deletion carries its left neighbour, else its right one: `ocasion` -> `occasion`
    teaches c -> cc), counted over the list. Returns written segment -> the segments it stands for, most frequent
    first, the rewrites seen at least CONFUSION_MIN_COUNT times that are more than one letter for one (those SymSpell's
    closest words already cover). Patterns, not words: a listed misspelling itself is never looked up."""
    import difflib

    from ttt_pipeline.corruption.misspellings import misspelling_table

    counts: Counter = Counter()
    for right, wrongs in misspelling_table().items():
        for wrong in wrongs:
            for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, wrong, right, autojunk=False).get_opcodes():
                if tag == "equal":
                    continue
                if i1 == i2 or j1 == j2:  # insertion or deletion: anchor it on a neighbour
                    if i1 > 0:
                        i1, j1 = i1 - 1, j1 - 1
                    elif i2 < len(wrong):
                        i2, j2 = i2 + 1, j2 + 1
                    else:
                        continue
                counts[(wrong[i1:i2], right[j1:j2])] += 1
    out: dict[str, list[str]] = {}
    for (written, meant), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if n >= CONFUSION_MIN_COUNT and max(len(written), len(meant)) >= 2:  # one letter for one: SymSpell's own
            out.setdefault(written, []).append(meant)
    return {k: tuple(v) for k, v in out.items()}


@lru_cache(maxsize=1)
def _digit_letters() -> dict[str, str]:
    """digit -> the lower-case letters it stands for when a glyph or a key slips (`glyphs`): inverted from this
    project's own `ocr` (l -> 1, O -> 0, S -> 5, g -> 9, ...) and `keyboard` (top-row letters next to digits)
    families, so nothing here is tuned on noise the project did not write."""
    from ttt_pipeline.corruption.characters import KEYBOARD_NEIGHBOURS, OCR_SINGLE

    out: dict[str, set[str]] = {}
    for table in (OCR_SINGLE, KEYBOARD_NEIGHBOURS):
        for letter, written in table.items():
            for r in written:
                if letter.isalpha() and r.isdigit():
                    out.setdefault(r, set()).add(letter.lower())
    return {d: "".join(sorted(v)) for d, v in sorted(out.items())}


@lru_cache(maxsize=1)
def _counts() -> dict[str, int]:
    """The shipped dictionary as word -> count, in its file's order, read as symspellpy's load_dictionary reads it
    (first two columns; a count that is not a 64-bit integer, or not above 0, skips the line; a repeated word's
    counts add up) but without the delete index symspellpy builds beside it (135 MB and 2 s): _DeleteIndex answers
    the searches, and symspellpy's own search (_base) loads only for those it does not."""
    counts: dict[str, int] = {}
    with resources.as_file(resources.files("symspellpy") / DICTIONARY) as path:
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.rstrip().split(" ")
                try:
                    n = int(parts[1]) if len(parts) >= 2 else 0
                except ValueError:
                    continue
                if 0 < n < 2 ** 63:
                    before = counts.get(parts[0], 0)
                    counts[parts[0]] = before + n if sys.maxsize - before > n else sys.maxsize
    return counts


@lru_cache(maxsize=4)
def _base(max_edit_distance: int) -> SymSpell:
    """symspellpy's search over the shipped dictionary, once per edit distance (2 s and 135 MB; never mutated
    afterwards). Loaded only for the searches _DeleteIndex leaves to it: edit distance 3 (the dictionary's longest
    word has 28 letters, so none reaches past _INDEXED)."""
    sym = SymSpell(max_dictionary_edit_distance=max_edit_distance, prefix_length=_PREFIX_LENGTH)
    with resources.as_file(resources.files("symspellpy") / DICTIONARY) as path:
        if not sym.load_dictionary(str(path), term_index=0, count_index=1, encoding="utf-8"):
            raise FileNotFoundError(f"symspellpy dictionary {DICTIONARY} could not be loaded")
    return sym


@lru_cache(maxsize=1)
def _bigrams() -> tuple[dict[str, dict[str, float]], int, int]:
    """symspellpy's shipped bigram counts as first word -> {second word: log count} (SpellRepair._ranked looks a
    pair up by two words it holds, without building the "w1 w2" string, and reads its log), their total and the
    smallest count listed (the list is cut there, so a missing pair means "rarer than this", not "never")."""
    follows: dict[str, dict[str, float]] = {}
    total, floor = 0, math.inf
    with resources.as_file(resources.files("symspellpy") / BIGRAMS) as path:
        with open(path, encoding="utf-8") as f:
            for line in f:
                first, second, n = line.split()
                count = int(n)
                follows.setdefault(first, {})[second] = math.log(count)
                total += count
                floor = min(floor, count)
    return follows, total, floor


def _jumble_key(word: str) -> str:
    """First letter, last letter, inner letters sorted: equal for a word and its inner shuffles."""
    return word[0] + word[-1] + "".join(sorted(word[1:-1]))


def _letters_key(word: str) -> str:
    return "".join(sorted(word))


@lru_cache(maxsize=1)
def _anagram_index() -> tuple[dict[str, str], dict[str, str]]:
    """(jumble key -> most frequent word, letters key -> most frequent word) over the shipped dictionary's
    alphabetic words; symspellpy has no permutation lookup, hence this index."""
    jumbles: dict[str, tuple[int, str]] = {}
    letters: dict[str, tuple[int, str]] = {}
    for w, n in _counts().items():
        if not w.isalpha():
            continue
        for index, key in ((letters, _letters_key(w)), (jumbles, _jumble_key(w) if len(w) >= 4 else None)):
            if key is not None and (key not in index or (n, w) > index[key]):
                index[key] = (n, w)
    return {k: w for k, (_, w) in jumbles.items()}, {k: w for k, (_, w) in letters.items()}



def _singled(word: str) -> str:
    """`word` with each run of a letter written once (good -> god): the same for a word and every spelling
    _undoubled makes of it."""
    return _RUN.sub(r"\1", word)


@lru_cache(maxsize=1)
def _singled_known() -> frozenset[str]:
    """_singled of every shipped-dictionary word and bare contraction: a word can undouble into one of them only if
    its own _singled is here, so most typos skip _undoubled's tries (SpellRepair._without_search)."""
    return frozenset(map(_singled, [*_counts(), *_bare_contractions()]))


def _undoubled(word: str, limit: int = 4):
    """Spellings of `word` with some of its doubled letters written once (at most 2**limit of them)."""
    runs = [i for i in range(1, len(word)) if word[i] == word[i - 1]][:limit]
    for mask in range(1, 2 ** len(runs)):
        drop = [runs[b] for b in range(len(runs)) if mask >> b & 1]  # ascending positions
        yield "".join(word[start + 1:end] for start, end in zip([-1] + drop, drop + [len(word)]))


@lru_cache(maxsize=1)
def _real_words() -> dict[str, str]:
    """`real_word`'s rewrites, found once for the whole shipped dictionary: each dictionary word rarer than
    REAL_WORD_MAX_COUNT whose letters spell one REAL_WORD_RATIO times as frequent (rae -> are) -> that word. (A
    training-vocabulary word is never one: the vocabulary adds only words the dictionary lacks.)"""
    counts, letters = _counts(), _anagram_index()[1]
    out = {}
    for word, n in counts.items():
        if n < REAL_WORD_MAX_COUNT:
            other = letters.get(_letters_key(word))
            if other and other != word and counts[other] >= REAL_WORD_RATIO * n:
                out[word] = other
    return out


@lru_cache(maxsize=1)
def _bare_contractions() -> frozenset[str]:
    """Dictionary words with an apostrophe, written without it (dont, im, theyre)."""
    return frozenset(w.replace("'", "") for w in _counts() if "'" in w)

