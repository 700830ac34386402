"""The repair itself: a text cut into words, each word that is likely a typo replaced by its correction
(the package docstring lists what is touched and which fixes apply), everything else copied byte for byte."""

from __future__ import annotations

import re
from collections import Counter
from itertools import product
from typing import Iterable, Mapping

from symspellpy import SymSpell

from ttt_pipeline.defenses.spell.cache import _remember
from ttt_pipeline.defenses.spell.dictionary import (
    EXTRA_COUNT,
    _anagram_index,
    _bare_contractions,
    _confusions,
    _counts,
    _digit_letters,
    _jumble_key,
    _real_words,
    _singled,
    _singled_known,
    _undoubled,
)
from ttt_pipeline.defenses.spell.index import (
    _INDEXED,
    _base_index,
    _closest,
    _DeleteIndex,
    _tie_ordered,
    _vocabulary_dictionary,
)
from ttt_pipeline.defenses.spell.ranking import BigramRanker, ContextRanker

# Word runs with internal apostrophes (don't, it’s); everything between them is copied verbatim.
_TOKEN = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
# The same, as re.split's one group: [gap, word, gap, word, ..., gap] in a single C call (repair's loop).
_SPLIT = re.compile(f"({_TOKEN.pattern})")
_CANDIDATE = re.compile(r"[A-Za-z]{2,}")
_TRIPLE = re.compile(r"(.)\1{2,}")
_DOUBLE = re.compile(r"(.)\1")  # _undoubled has nothing to try without one
_RUN = re.compile(r"(.)\1+")  # a letter written more than once in a row (_singled)
# `glyphs`: a word with a digit or two where letters belong (pr0duct, he11o, 9ood); numbers with units (80s, 4th,
# 1080p, 64gb) and model names (mp3, ps4, sd850) do not match: 3+ letters, at most 2 digits, 1 leading digit at most.
_TRAILING_DIGITS = re.compile(r"([a-z]+)[0-9]+")
_GLYPH = re.compile(r"(?=(?:[^A-Za-z]*[A-Za-z]){3})(?!(?:[^0-9]*[0-9]){3})(?![0-9]{2})[A-Za-z0-9]*[0-9][A-Za-z0-9]*")
_ACRONYM_MAX = 4  # all-caps words up to this length are left as written
# Typo fixes beyond SymSpell's closest word (see SpellRepair._correct); chosen by bench/spell_repair.py's rule.
FIXES = frozenset({"undouble", "jumble", "jumble_late", "case", "real_word", "context", "confusions", "glyphs"})
# The fixes on by default: the combination that passed the rule's check, and `glyphs`, which passed the
# glyph-and-digit rule (both rules: bench/spell_repair.py's docstring); `jumble` (one line beside jumble_late) is
# kept as an option.
DEFAULT_FIXES = ("undouble", "case", "real_word", "jumble_late", "context", "glyphs")
# How equally close candidates are chosen: `frequency` the most frequent; `bigram` (the `context` fix, on by default)
# the most probable between the neighbours by symspellpy's bigram counts; `context` that score with in-domain pairs
# (domain_texts), look-alike shapes (ranking.LOOKALIKES) and a gate (ranking.ContextRanker).
RANKINGS = ("frequency", "bigram", "context")


def domain_bigrams(texts: list[str]) -> tuple[dict[str, dict[str, int]], int]:
    """(first word -> {second word: count}, total) over the lower-cased word pairs of `texts` that only whitespace
    separates: the pairs the repair reads as neighbours (SpellRepair._repaired)."""
    follows: dict[str, dict[str, int]] = {}
    total = 0
    for text in texts:
        parts = _SPLIT.split(text.lower())
        for i in range(1, len(parts) - 2, 2):
            if parts[i + 1].isspace():
                row = follows.setdefault(parts[i], {})
                row[parts[i + 2]] = row.get(parts[i + 2], 0) + 1
                total += 1
    return follows, total


def _ranking_fixes(fixes: frozenset[str], ranking: str | None, gate: float) -> tuple[frozenset[str], str]:
    """(fixes, ranking) as the repair runs them: `ranking` None follows the fixes (bigram with `context`, else
    frequency); frequency takes `context` out of the fixes, bigram and context put it in. A gate needs the context
    ranking, the only one that reads it."""
    if ranking is None:
        ranking = "bigram" if "context" in fixes else "frequency"
    if ranking not in RANKINGS:
        raise ValueError(f"unknown spell ranking {ranking!r}; known: {list(RANKINGS)}")
    if gate < 0 or (gate and ranking != "context"):
        raise ValueError(f"a spell gate of {gate} needs ranking 'context' and a value >= 0 (ranking: {ranking!r})")
    return (fixes - {"context"} if ranking == "frequency" else fixes | {"context"}), ranking


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


def _resolved(word: str, fixed: str | tuple | None) -> str | tuple[str, tuple]:
    """A word's repair from its cached correction (SpellRepair._resolve)."""
    if isinstance(fixed, tuple):
        return word, fixed
    return word if fixed is None else _recase(word, fixed)


_MISSING = object()


class SpellRepair:
    """Repairs misspelled words of a text, leaving everything else byte for byte (see the module docstring)."""

    def __init__(self, max_edit_distance: int = 2,
                 extra_vocabulary: Iterable[str] | Mapping[str, int] | None = None, min_count: int = 2,
                 fixes: Iterable[str] = DEFAULT_FIXES, ranking: str | None = None, gate: float = 0.0,
                 domain_texts: Iterable[str] | None = None):
        if max_edit_distance < 1:
            raise ValueError(f"max_edit_distance must be >= 1, got {max_edit_distance}")
        fixes, self.ranking = _ranking_fixes(frozenset(fixes), ranking, gate)
        self.max_edit_distance = int(max_edit_distance)
        self._words = _counts()  # word -> count
        self._keep_bare = _bare_contractions()
        self._extra: SymSpell | None = None
        # (_DeleteIndex, symspellpy's search over the same words where one is loaded: _closest)
        self._dictionaries: list[tuple[_DeleteIndex, SymSpell | None]] = [(_base_index(self.max_edit_distance), None)]
        self.extra_words: frozenset[str] = frozenset()
        if extra_vocabulary is not None:
            counts = vocabulary_counts(extra_vocabulary)
            words = sorted(w for w, c in counts.items() if c >= min_count and w not in self._words)
            if words:
                # A small second dictionary instead of adding to the shared, cached base (slow to load).
                self._extra, index = _vocabulary_dictionary(tuple(words), self.max_edit_distance)
                self.extra_words = frozenset(words)
                self._dictionaries.append((index, self._extra))
        self.fixes = frozenset(fixes)
        undouble = "undouble" in self.fixes
        self._singled_base = _singled_known() if undouble else frozenset()
        self._singled_extra = frozenset(map(_singled, self.extra_words)) if undouble else frozenset()
        unknown = self.fixes - FIXES
        if unknown:
            raise ValueError(f"unknown spell fixes {sorted(unknown)}; known: {sorted(FIXES)}")
        self._jumbles = _anagram_index()[0] if self.fixes else {}
        self._real_words = _real_words() if "real_word" in self.fixes else {}
        self._confused = _confusions() if "confusions" in self.fixes else {}
        self._context = "context" in self.fixes
        self._glyphs = "glyphs" in self.fixes
        self._ranker = BigramRanker(self._count, self._words) if self._context else None
        if self.ranking == "context":
            domain = domain_bigrams(list(domain_texts)) if domain_texts is not None else None
            self._ranker = ContextRanker(self._count, self._words, gate, domain)
        # Caches, each bounded by cache._CACHE_LIMIT (outputs never depend on them: every entry is a pure function of
        # its key): lower-case word -> correction (_correct); word as written -> its repair, or (word, candidates)
        # when neighbours choose (_resolve); (word, before, after) -> the repair chosen between those neighbours.
        self._cache: dict[str, str | tuple | None] = {}
        self._tokens: dict[str, str | tuple[str, tuple]] = {}
        self._ranks: dict[tuple[str, str | None, str | None], str] = {}
        self._stats: dict[str, tuple] = self._ranker.stats if self._ranker else {}  # candidate -> its statistics

    def _known(self, word: str) -> bool:
        return word in self._words or word in self.extra_words or word in self._keep_bare

    def _may_undouble(self, word: str) -> bool:
        """Whether some known word is `word` with letters of its runs written once (_singled_known)."""
        single = _singled(word)
        return single in self._singled_base or single in self._singled_extra

    def _count(self, word: str) -> int:
        return EXTRA_COUNT if word in self.extra_words else self._words.get(word, 0)

    def _correct(self, low: str) -> str | tuple | None:
        """Lower-case correction of a lower-case candidate, None to keep it, or its equally close candidates."""
        fixed, search = self._without_search(low)
        return fixed if search is None else self._from_closest(low, search[0], self._candidates([search])[0])

    def _without_search(self, low: str) -> tuple[str | None, tuple[str, int] | None]:
        """(correction, None) when no closest-word search is needed, else (None, (word to search, edit limit))."""
        if self._known(low):
            return self._real_words.get(low), None  # `real_word`
        if not low.isalpha():  # a glyph word (`glyphs`): only _to_correct's _GLYPH lets digits in
            return self._unglyphed(low), None
        squeezed = _TRIPLE.sub(r"\1\1", low) if _TRIPLE.search(low) else low
        if squeezed != low and self._known(squeezed):
            return squeezed, None
        if "undouble" in self.fixes and _DOUBLE.search(squeezed) and self._may_undouble(squeezed):
            known = [w for w in _undoubled(squeezed) if self._known(w)]
            if known:
                return max(known, key=lambda w: (self._count(w), w)), None
        if "jumble" in self.fixes and len(squeezed) >= 4 and _jumble_key(squeezed) in self._jumbles:
            return self._jumbles[_jumble_key(squeezed)], None
        return None, (squeezed, 1 if len(squeezed) <= 3 else self.max_edit_distance)

    def _from_closest(self, low: str, squeezed: str, found: tuple) -> str | tuple | None:
        """_correct's answer from the closest words `found` of `squeezed` (_candidates)."""
        if self._confused:  # the closest words, then those a learned confusion reaches: the neighbours choose
            seen = {term for term, _ in found}
            found += tuple(item for item in self._learned(squeezed) if item[0] not in seen)
        if self.ranking == "context":  # the known words it looks like join: the neighbours and the shapes choose
            seen = {term for term, _ in found}
            found += tuple((w, self._count(w)) for w in sorted(self._ranker.lookalikes(squeezed))
                           if w not in seen and self._known(w))
        if len(found) > 1 and self._context:
            return found  # ranked per occurrence, by its neighbours (BigramRanker.best)
        best = max(found, key=lambda f: f[1])[0] if found else None  # the most frequent; ties: lookup order
        if best is None and "jumble_late" in self.fixes and len(squeezed) >= 4:
            best = self._jumbles.get(_jumble_key(squeezed))
        return None if best is None or best == low else best

    def _unglyphed(self, low: str) -> str | tuple | None:
        """The known word `low` spells with each digit read as a letter it is confused with (_digit_letters), or
        None; several: the most frequent, or all of them for the neighbours to rank (`context`)."""
        stem = _TRAILING_DIGITS.fullmatch(low)
        if stem and self._known(stem.group(1)):
            return None  # a known word and a number (ipod2, the2): a name or two words run together
        table = _digit_letters()
        options = [table.get(c, "") if c.isdigit() else c for c in low]
        found = {w: self._count(w) for w in map("".join, product(*options)) if self._known(w)}
        ranked = tuple(sorted(found.items(), key=lambda item: (-item[1], item[0])))
        if len(ranked) > 1 and self._context:
            return ranked
        return ranked[0][0] if ranked else None

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

    def _candidates(self, queries: list[tuple[str, int]]) -> list[tuple[tuple[str, int], ...]]:
        """For each (word, limit): (term, count) of the closest words within `limit` of the dictionary and the
        training vocabulary, the dictionary's first (searched in one batch: _closest), each in symspellpy's lookup
        order: by count, equal counts in its search's order, which only its search knows; so symspellpy's search
        answers when counts tie (vocabulary words all share one) among the nearest (the ones kept: _tie_ordered)."""
        searched, limits = [], [limit for _, limit in queries]
        for index, sym in self._dictionaries:
            searched.append((index, sym, _closest(index, sym, list(zip([w for w, _ in queries], limits)))))
            # a later dictionary's words count only at the nearest distance found so far: where that is 1, it need
            # not search at 2 (the index answers both ways, so its answers within 1 are the same)
            limits = [1 if limit == 2 and answer[0] == 1 and len(word) + 2 <= _INDEXED else limit
                      for (word, _), limit, answer in zip(queries, limits, searched[-1][2])]
        out = []
        for q, (word, limit) in enumerate(queries):
            hits = [(index, sym, found[q]) for index, sym, found in searched if found[q][1]]
            nearest = min((distance for _, _, (distance, _, _) in hits), default=0)
            found = []
            for index, sym, (distance, items, load) in hits:
                if distance == nearest:
                    found += items if load is None else _tie_ordered(index, sym, word, limit, load)
            out.append(tuple(found))
        return out

    def _neighbour(self, word: str | None) -> str | None:
        """A context word for the ranking: a known word with a count, lower-cased, or None."""
        if word is None:
            return None
        low = word.lower()
        return low if self._count(low) > 0 else None

    def _to_correct(self, token: str) -> str | None:
        """The token as it is corrected (shift-key slips undone), or None when it is left as written."""
        if not _CANDIDATE.fullmatch(token) and not (self._glyphs and _GLYPH.fullmatch(token)):
            return None
        word = self._case_typo(token) if not _plain_case(token) and "case" in self.fixes else token
        if not _plain_case(word):
            return None  # mixed case: a deliberate spelling (iPod, SanDisk)
        if word.isupper() and len(word) <= _ACRONYM_MAX:
            return None  # DVD, USB, HDMI: acronyms, which the dictionary lacks (it would make DID, US, HOME)
        return word

    def _resolve(self, token: str) -> str | tuple[str, tuple]:
        """A token's repair, or (its spelling, equally close candidates) when its neighbours choose (_in_context)."""
        word = self._to_correct(token)
        if word is None:
            return token
        low = word.lower()
        try:
            fixed = self._cache[low]
        except KeyError:
            fixed = self._remember_word(low, self._correct(low))
        return _resolved(word, fixed)

    def _remember_word(self, low: str, fixed: str | tuple | None):
        """Caches _correct's answer for `low` (candidates prepared for the ranking); returns what was cached."""
        return _remember(self._cache, low, self._ranker.prepared(fixed) if isinstance(fixed, tuple) else fixed)

    def _prefetch(self, tokens: Iterable[str]) -> None:
        """Resolves the new `tokens` ahead of repair's loop, as _resolve would, but with all the closest-word
        searches of their words in one batch (_DeleteIndex.closest: a few array operations for all of them)."""
        words: dict[str, str] = {}  # token -> its word to correct
        searches: dict[str, tuple[str, int]] = {}  # word (lower case) -> (word to search, edit limit)
        for token in tokens:
            word = self._to_correct(token)
            if word is None:
                _remember(self._tokens, token, token)
                continue
            words[token] = word
            low = word.lower()
            if low not in self._cache and low not in searches:
                fixed, search = self._without_search(low)
                if search is None:
                    self._remember_word(low, fixed)
                else:
                    searches[low] = search
        queries = list(dict.fromkeys(searches.values()))
        found = dict(zip(queries, self._candidates(queries))) if queries else {}
        for low, search in searches.items():
            self._remember_word(low, self._from_closest(low, search[0], found[search]))
        for token, word in words.items():
            fixed = self._cache.get(word.lower(), _MISSING)  # missing: the bounded cache was cleared meanwhile
            _remember(self._tokens, token, self._resolve(token) if fixed is _MISSING else _resolved(word, fixed))

    def _in_context(self, resolved: tuple[str, tuple], before: str | None, after: str | None) -> str:
        """The candidate of `resolved` (_resolve) most probable between the repaired left and the written right
        neighbour (None: no neighbour across a space), re-cased like the word; the word as written when the
        ranking's gate finds no candidate clearly best (`ranking: context`)."""
        word, found = resolved
        key = (word, self._neighbour(before), self._neighbour(after))
        try:
            return self._ranks[key]
        except KeyError:
            chosen = self._ranker.best(found, key[1], key[2], word.lower())
            return _remember(self._ranks, key, word if chosen is None else _recase(word, chosen))

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
        return self.repair_all([text])[0]

    def repair_all(self, texts: list[str]) -> list[str]:
        split = [_SPLIT.split(t) for t in texts]  # each: gap, word, gap, ..., gap
        tokens = self._tokens
        self._prefetch({token for parts in split for token in parts[1::2] if token not in tokens})
        return [self._repaired(parts) for parts in split]

    def _repaired(self, parts: list[str]) -> str:
        """The text of _SPLIT's `parts` repaired. Left to right, so a word's left neighbour is already repaired;
        neighbours count only across spaces. Each distinct token is resolved once (_tokens), so a known word costs
        one dict lookup; only words whose equally close candidates tie on distance look at neighbours."""
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
