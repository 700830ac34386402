"""Spelling repair in front of the model: word-level SymSpell lookups on symspellpy's English dictionary.

Why word-level `lookup` (not `lookup_compound`): compound segmentation is far too slow for a test set and
rewrites spacing; per-word lookups with a per-word cache cost little once the review vocabulary is seen.
Only what is likely a typo is touched, so clean text passes through (almost) unchanged:

- the text is cut into word / non-word runs; punctuation, whitespace and numbers are copied verbatim;
- candidates are ASCII alphabetic words of 2+ letters: words with digits, apostrophes (don't) or other
  scripts, mixed-case words (iPod, SanDisk: deliberate brand spellings) and all-caps words of up to 4
  letters (DVD, USB, HDMI: acronyms the dictionary lacks) are left as written;
- words in the dictionary or in the training vocabulary are kept, and so are contractions written without
  their apostrophe (dont, im): SymSpell would otherwise turn them into other words (done, in);
- runs of 3+ equal letters are cut to 2 first (goooood -> good: English has no triple letters);
- the correction is the closest word (TOP verbosity, ties by frequency), re-cased like the input
  (BATTRY -> BATTERY, Graet -> Great); words of 2-3 letters only accept 1 edit (2 edits reach too much).

Typo fixes beyond the closest word (`fixes`; DEFAULT_FIXES are the ones that passed bench/spell_repair.py's
check on training reviews, docs/results.md): `undouble` (letters doubled by a sticky key, written once when that
makes a known word: purchasseedd -> purchased), `case` (shift-key slips on a capitalised word: TThe -> The,
hTese -> These; other mixed case is still left alone), `real_word` (a dictionary word rarer than 10^7 whose
letters spell one 1,000x as frequent: rae -> are), `jumble_late` (inner letters shuffled, first and last kept,
when no word is within the edit distance: nveagite -> negative), `context` (when several words are equally close,
the one most probable between its neighbours by symspellpy's shipped bigram counts, instead of the most frequent:
"I ahd" -> "I had", not "and"; without known neighbours it is the most frequent, as before), `confusions` (the known
words one rewrite away that real misspellings show, learned from codespell's list of Wikipedia's common
misspellings: gud -> good, ocasion -> occasion; they join SymSpell's closest words and the neighbours rank them all;
an option until bench/spell_repair.py's rule adopts it). An option, not on by
default (it failed the check: it costs keyboard typos): `jumble` (the same before the closest-word lookup).

`extra_vocabulary` (training texts, words, or a word -> count mapping such as `defenses.vocabulary`'s) adds
the words seen at least `min_count` times that the dictionary lacks (product names, jargon, the domain's
slang) at a high frequency, so they survive and their misspellings are repaired towards them.
Deterministic: no randomness; ties go to the more frequent word, then symspellpy's stable order.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from functools import lru_cache
from importlib import resources
from typing import Callable, Iterable, Mapping

from symspellpy import SymSpell, Verbosity

__all__ = ["SpellRepair", "get_repair", "DICTIONARY"]

DICTIONARY = "frequency_dictionary_en_82_765.txt"
BIGRAMS = "frequency_bigramdictionary_en_243_342.txt"
# Count given to training-vocabulary words: above ~90% of the dictionary (so a product name wins a tie with
# a rare dictionary word) but far below function words (the: 2.3e10), which must keep winning their ties.
EXTRA_COUNT = 10_000_000
# Word runs with internal apostrophes (don't, it’s); everything between them is copied verbatim.
_TOKEN = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
# The same, as re.split's one group: [gap, word, gap, word, ..., gap] in a single C call (repair's loop).
_SPLIT = re.compile(f"({_TOKEN.pattern})")
_CANDIDATE = re.compile(r"[A-Za-z]{2,}")
_TRIPLE = re.compile(r"(.)\1{2,}")
_ACRONYM_MAX = 4  # all-caps words up to this length are left as written
# Typo fixes beyond SymSpell's closest word (see SpellRepair._correct); chosen by bench/spell_repair.py's rule.
FIXES = frozenset({"undouble", "jumble", "jumble_late", "case", "real_word", "context", "confusions"})
# The fixes on by default: the combination that passed the rule's check (docs/results.md, 2026-11-23); `jumble`
# (one line beside jumble_late) is kept as an option; the typo priors that failed it were removed (commit f71fec2).
DEFAULT_FIXES = ("undouble", "case", "real_word", "jumble_late", "context")
REAL_WORD_MAX_COUNT = 10_000_000  # real_word only rewrites dictionary words rarer than this ...
REAL_WORD_RATIO = 1000  # ... into an anagram at least this many times more frequent
_CACHE_LIMIT = 500_000  # entries of each per-instance cache; a cache is cleared when full (bounded memory)
CONFUSION_MIN_COUNT = 10  # `confusions`: a rewrite is learned when at least this many listed misspellings show it


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


@lru_cache(maxsize=4)
def _base(max_edit_distance: int) -> SymSpell:
    """The shipped dictionary, loaded once per edit distance (it takes seconds; never mutated afterwards)."""
    sym = SymSpell(max_dictionary_edit_distance=max_edit_distance, prefix_length=7)
    with resources.as_file(resources.files("symspellpy") / DICTIONARY) as path:
        if not sym.load_dictionary(str(path), term_index=0, count_index=1, encoding="utf-8"):
            raise FileNotFoundError(f"symspellpy dictionary {DICTIONARY} could not be loaded")
    return sym


@lru_cache(maxsize=1)
def _bigrams() -> tuple[dict[str, int], int, int]:
    """symspellpy's shipped bigram counts ("w1 w2" -> count), their total and the smallest count listed (the
    list is cut there, so a missing pair means "rarer than this", not "never")."""
    counts: dict[str, int] = {}
    with resources.as_file(resources.files("symspellpy") / BIGRAMS) as path:
        with open(path, encoding="utf-8") as f:
            for line in f:
                first, second, n = line.split()
                counts[f"{first} {second}"] = int(n)
    return counts, sum(counts.values()), min(counts.values())


def _jumble_key(word: str) -> str:
    """First letter, last letter, inner letters sorted: equal for a word and its inner shuffles."""
    return word[0] + word[-1] + "".join(sorted(word[1:-1]))


def _letters_key(word: str) -> str:
    return "".join(sorted(word))


@lru_cache(maxsize=4)
def _anagram_index(max_edit_distance: int) -> tuple[dict[str, str], dict[str, str]]:
    """(jumble key -> most frequent word, letters key -> most frequent word) over the shipped dictionary's
    alphabetic words; symspellpy has no permutation lookup, hence this index."""
    jumbles: dict[str, tuple[int, str]] = {}
    letters: dict[str, tuple[int, str]] = {}
    for w, n in _base(max_edit_distance).words.items():
        if not w.isalpha():
            continue
        for index, key in ((letters, _letters_key(w)), (jumbles, _jumble_key(w) if len(w) >= 4 else None)):
            if key is not None and (key not in index or (n, w) > index[key]):
                index[key] = (n, w)
    return {k: w for k, (_, w) in jumbles.items()}, {k: w for k, (_, w) in letters.items()}


def _undoubled(word: str, limit: int = 4):
    """Spellings of `word` with some of its doubled letters written once (at most 2**limit of them)."""
    runs = [i for i in range(1, len(word)) if word[i] == word[i - 1]][:limit]
    for mask in range(1, 2 ** len(runs)):
        drop = {runs[b] for b in range(len(runs)) if mask >> b & 1}
        yield "".join(c for i, c in enumerate(word) if i not in drop)


@lru_cache(maxsize=4)
def _bare_contractions(max_edit_distance: int) -> frozenset[str]:
    """Dictionary words with an apostrophe, written without it (dont, im, theyre)."""
    return frozenset(w.replace("'", "") for w in _base(max_edit_distance).words if "'" in w)


def vocabulary_counts(texts: Iterable[str] | Mapping[str, int]) -> Counter:
    """Lower-cased candidate words of texts (or of single words), counted; a word -> count mapping (the
    stored training vocabulary, `defenses.vocabulary`) keeps its counts."""
    counts: Counter = Counter()
    if isinstance(texts, Mapping):
        for word, n in texts.items():
            if _CANDIDATE.fullmatch(word):
                counts[word.lower()] += int(n)
        return counts
    for text in texts:
        counts.update(t.lower() for t in _TOKEN.findall(text) if _CANDIDATE.fullmatch(t))
    return counts


def _plain_case(word: str) -> bool:
    """lower, UPPER or Capitalised: anything else is mixed case (iPod), a deliberate spelling."""
    return word.islower() or word.isupper() or word[1:].islower()


def _recase(word: str, fixed: str) -> str:
    if word.isupper():
        return fixed.upper()
    if word[0].isupper():
        return fixed[:1].upper() + fixed[1:]
    return fixed


def _remember(cache: dict, key, value):
    """cache[key] = value, the cache cleared first when it holds _CACHE_LIMIT entries; returns value."""
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value


class SpellRepair:
    """Repairs misspelled words of a text, leaving everything else byte for byte (see the module docstring)."""

    def __init__(self, max_edit_distance: int = 2,
                 extra_vocabulary: Iterable[str] | Mapping[str, int] | None = None, min_count: int = 2,
                 fixes: Iterable[str] = DEFAULT_FIXES):
        if max_edit_distance < 1:
            raise ValueError(f"max_edit_distance must be >= 1, got {max_edit_distance}")
        self.max_edit_distance = int(max_edit_distance)
        self._sym = _base(self.max_edit_distance)
        self._keep_bare = _bare_contractions(self.max_edit_distance)
        self._extra: SymSpell | None = None
        self.extra_words: frozenset[str] = frozenset()
        if extra_vocabulary is not None:
            counts = vocabulary_counts(extra_vocabulary)
            words = sorted(w for w, c in counts.items() if c >= min_count and w not in self._sym.words)
            if words:
                # A small second dictionary instead of adding to the shared, cached base (slow to load).
                self._extra = SymSpell(max_dictionary_edit_distance=self.max_edit_distance, prefix_length=7)
                for w in words:
                    self._extra.create_dictionary_entry(w, EXTRA_COUNT)
                self.extra_words = frozenset(words)
        self.fixes = frozenset(fixes)
        unknown = self.fixes - FIXES
        if unknown:
            raise ValueError(f"unknown spell fixes {sorted(unknown)}; known: {sorted(FIXES)}")
        self._jumbles, self._letters = _anagram_index(self.max_edit_distance) if self.fixes else ({}, {})
        self._confused = _confusions() if "confusions" in self.fixes else {}
        self._context = "context" in self.fixes
        if self._context:
            self._pairs, pairs_total, self._floor = _bigrams()
            self._total = sum(self._sym.words.values())
            self._scale = pairs_total / self._total  # bigram per unigram count: the lists come from different corpora
        # Caches, each bounded by _CACHE_LIMIT (outputs never depend on them: every entry is a pure function of
        # its key): lower-case word -> correction (_correct); word as written -> its repair, or (word, candidates)
        # when neighbours choose (_resolve); (word, before, after) -> the repair chosen between those neighbours.
        self._cache: dict[str, str | tuple | None] = {}
        self._tokens: dict[str, str | tuple[str, tuple]] = {}
        self._ranks: dict[tuple[str, str | None, str | None], str] = {}

    def _known(self, word: str) -> bool:
        return word in self._sym.words or word in self.extra_words or word in self._keep_bare

    def _count(self, word: str) -> int:
        return EXTRA_COUNT if word in self.extra_words else self._sym.words.get(word, 0)

    def _real_word(self, low: str) -> str | None:
        """A rare dictionary word whose letters spell a far more frequent one (rae -> are), or None."""
        n = self._sym.words.get(low)
        if n is None or n >= REAL_WORD_MAX_COUNT or low in self.extra_words:
            return None
        other = self._letters.get(_letters_key(low))
        return other if other and other != low and self._count(other) >= REAL_WORD_RATIO * n else None

    def _correct(self, low: str) -> str | None:
        """Lower-case correction of a lower-case candidate, or None to keep it."""
        if self._known(low):
            return self._real_word(low) if "real_word" in self.fixes else None
        squeezed = _TRIPLE.sub(r"\1\1", low)
        if squeezed != low and self._known(squeezed):
            return squeezed
        if "undouble" in self.fixes:
            known = [w for w in _undoubled(squeezed) if self._known(w)]
            if known:
                return max(known, key=lambda w: (self._count(w), w))
        if "jumble" in self.fixes and len(squeezed) >= 4 and _jumble_key(squeezed) in self._jumbles:
            return self._jumbles[_jumble_key(squeezed)]
        limit = 1 if len(squeezed) <= 3 else self.max_edit_distance
        found = self._candidates(squeezed, limit)
        if self._confused:  # the closest words, then those a learned confusion reaches: the neighbours choose
            seen = {term for term, _ in found}
            found += tuple(item for item in self._learned(squeezed) if item[0] not in seen)
        if len(found) > 1 and self._context:
            return found  # ranked per occurrence, by its neighbours (_ranked)
        best = max(found, key=lambda f: f[1])[0] if found else None  # the most frequent; ties: lookup order
        if best is None and "jumble_late" in self.fixes and len(squeezed) >= 4:
            best = self._jumbles.get(_jumble_key(squeezed))
        return None if best is None or best == low else best

    def _learned(self, word: str) -> tuple[tuple[str, int], ...]:
        """(term, count) of the known words one learned confusion away (`confusions`, _confusions()), in a fixed
        order; empty when none is. They join SymSpell's closest words, and the neighbours rank them all."""
        found: dict[str, int] = {}
        for written, meant in self._confused.items():
            start = word.find(written)
            while start != -1:
                for m in meant:
                    term = word[:start] + m + word[start + len(written):]
                    if term not in found and term != word and self._known(term):
                        found[term] = self._count(term)
                start = word.find(written, start + 1)
        return tuple(found.items())

    def _candidates(self, word: str, limit: int) -> tuple[tuple[str, int], ...]:
        """(term, count) of the closest words within `limit` of the dictionary and the training vocabulary."""
        found = [(f.term, f.distance, f.count) for sym in (self._sym, self._extra) if sym is not None
                 for f in sym.lookup(word, Verbosity.CLOSEST, max_edit_distance=limit)]
        nearest = min((d for _, d, _ in found), default=0)
        return tuple((term, count) for term, d, count in found if d == nearest)

    def _pair(self, first: str, second: str) -> float:
        """Bigram count in the shipped list, else what independence predicts, capped at the list's cut."""
        n = self._pairs.get(f"{first} {second}")
        if n is not None:
            return n
        expected = self._scale * self._count(first) * self._count(second) / self._total
        return max(min(expected, self._floor), 1.0)

    def _ranked(self, found: tuple, before: str | None, after: str | None) -> str:
        """The candidate most probable between its neighbours, P(w | before) P(after | w) (neighbours that are
        not known words count as absent); ties: frequency, then lookup order.
        Written here because symspellpy ranks by distance and frequency only (its compound lookup uses bigrams
        but rewrites spacing and is too slow: module docstring)."""
        def score(item):  # log P(w | before) + log P(after | w), without the terms all candidates share
            index, (term, count) = item
            n = max(self._count(term), 1)
            left = math.log(self._pair(before, term) if before else n)
            right = math.log(self._pair(term, after)) - math.log(self._scale * n) if after else 0.0
            return left + right, count, -index
        return max(enumerate(found), key=score)[1][0]

    def _neighbour(self, word: str | None) -> str | None:
        """A context word for _ranked: a known word with a count, lower-cased, or None."""
        if word is None:
            return None
        low = word.lower()
        return low if self._count(low) > 0 else None

    def _resolve(self, word: str) -> str | tuple[str, tuple]:
        """A token's repair, or (its spelling, equally close candidates) when its neighbours choose (_in_context)."""
        if not _CANDIDATE.fullmatch(word):
            return word
        if not _plain_case(word) and "case" in self.fixes:
            word = self._case_typo(word)
        if not _plain_case(word):
            return word  # mixed case: a deliberate spelling (iPod, SanDisk)
        if word.isupper() and len(word) <= _ACRONYM_MAX:
            return word  # DVD, USB, HDMI: acronyms, which the dictionary lacks (it would make DID, US, HOME)
        low = word.lower()
        try:
            fixed = self._cache[low]
        except KeyError:
            fixed = _remember(self._cache, low, self._correct(low))
        if isinstance(fixed, tuple):
            return word, fixed
        return word if fixed is None else _recase(word, fixed)

    def _in_context(self, resolved: tuple[str, tuple], before: str | None, after: str | None) -> str:
        """The candidate of `resolved` (_resolve) most probable between the repaired left and the written right
        neighbour (None: no neighbour across a space), re-cased like the word."""
        word, found = resolved
        key = (word, self._neighbour(before), self._neighbour(after))
        try:
            return self._ranks[key]
        except KeyError:
            return _remember(self._ranks, key, _recase(word, self._ranked(found, key[1], key[2])))

    def _case_typo(self, word: str) -> str:
        """Shift-key slips on a capitalised word, undone: a doubled capital (TThe -> The) or the capital one
        letter late (hTese -> These, tI -> It); any other mixed case is left as written."""
        if len(word) >= 3 and word[0].isupper() and word[1] == word[0] and word[2:].islower():
            return word[1:]
        if word[0].islower() and word[1].isupper() and (word[2:].islower() or len(word) == 2):
            swapped = word[1] + word[0] + word[2:]
            if self._known(swapped.lower()):
                return swapped
        return word

    def repair(self, text: str) -> str:
        """The text with its misspelled words replaced; everything else unchanged."""
        # parts alternate gap, word, gap, ..., gap. Left to right, so a word's left neighbour is already repaired;
        # neighbours count only across spaces. Each distinct token is resolved once (_tokens), so a known word
        # costs one dict lookup; only words whose equally close candidates tie on distance look at neighbours.
        parts = _SPLIT.split(text)
        tokens, last = self._tokens, len(parts) - 2
        for i in range(1, len(parts), 2):
            token = parts[i]
            fixed = tokens.get(token)
            if fixed is None:
                fixed = _remember(tokens, token, self._resolve(token))
            if fixed.__class__ is tuple:
                fixed = self._in_context(fixed, parts[i - 2] if i > 1 and parts[i - 1].isspace() else None,
                                         parts[i + 2] if i < last and parts[i + 1].isspace() else None)
            parts[i] = fixed
        return "".join(parts)

    def repair_all(self, texts: list[str]) -> list[str]:
        return [self.repair(t) for t in texts]

    __call__ = repair_all


_by_digest: dict[tuple[int, str | None], SpellRepair] = {}


def get_repair(max_edit_distance: int = 2, extra_texts_digest: str | None = None,
               extra_vocabulary: Iterable[str] | Mapping[str, int] | None = None) -> SpellRepair:
    """A shared SpellRepair, so its word cache carries over between calls. With a vocabulary, pass
    `extra_texts_digest` (e.g. the training set's digest): it, not the texts, keys the share; without a
    digest a vocabulary gets a fresh instance."""
    if extra_vocabulary is not None and extra_texts_digest is None:
        return SpellRepair(max_edit_distance, extra_vocabulary)
    key = (max_edit_distance, extra_texts_digest if extra_vocabulary is not None else None)
    hit = _by_digest.get(key)
    if hit is None:
        hit = _by_digest[key] = SpellRepair(max_edit_distance, extra_vocabulary)
        while len(_by_digest) > 8:  # oldest first
            _by_digest.pop(next(iter(_by_digest)))
    return hit


def build(settings, context: dict) -> Callable[[list[str]], list[str]]:
    """The registry's constructor for a text repair: `ttt.spell_max_edit_distance`, and the training vocabulary
    when the context has one (`context["vocabulary"]`)."""
    return SpellRepair(max_edit_distance=getattr(settings, "spell_max_edit_distance", 2),
                       extra_vocabulary=context.get("vocabulary")).repair_all
