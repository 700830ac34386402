"""How `spell` chooses among equally close candidates: by their neighbours (the `context` fix), from symspellpy's
shipped bigram counts, where SymSpell itself ranks by distance and frequency only."""

from __future__ import annotations

import math
from typing import Callable

from ttt_pipeline.defenses.spell.cache import _remember
from ttt_pipeline.defenses.spell.dictionary import _bigrams

_NO_PAIRS: dict[str, float] = {}  # a word no bigram starts with


class BigramRanker:
    """Scores candidates between a left and a right neighbour, P(w | before) P(after | w), from the shipped bigram
    counts, the unigram counts standing in for a pair the list lacks (the independence estimate)."""

    def __init__(self, count: Callable[[str], int], words: dict[str, int]):
        self._count = count  # word -> its count (the dictionary's, or the vocabulary's EXTRA_COUNT), 0 if unknown
        self._follows, pairs_total, self._floor = _bigrams()
        self._total = sum(words.values())
        self._scale = pairs_total / self._total  # bigram per unigram count: the lists come from different corpora
        self.stats: dict[str, tuple] = {}  # candidate -> _term_stats

    def prepared(self, found: tuple) -> tuple:
        """found's (term, count), each with what `best` needs of it whatever the neighbours (_term_stats); one
        stored tuple per term, reused by every misspelling it is a candidate of (the count is the term's own)."""
        stats, term_stats = self.stats, self._term_stats
        return tuple([s if (s := stats.get(term)) is not None and s[1] == count else term_stats(term, count)
                      for term, count in found])

    def _term_stats(self, term: str, count: int) -> tuple:
        """(term, count, the count for the independence estimate, log n, log(scale n), scale * that count), n being
        it or 1; kept per term, since the same words are candidates of many misspellings. Strings and numbers only,
        no reference to the bigram dicts: Python's collector stops tracking such a tuple, never one holding a dict,
        and tens of thousands of tracked tuples per 400 reviews made it walk the whole dictionary (0.6 s) every few
        repairs."""
        raw = self._count(term)
        n = max(raw, 1)
        return _remember(self.stats, term, (term, count, raw, math.log(n), math.log(self._scale * n),
                                             self._scale * raw))

    def best(self, found: tuple, before: str | None, after: str | None, written: str | None = None) -> str:
        """The candidate (of `prepared`'s `found`) most probable between its neighbours, P(w | before) P(after | w)
        (neighbours that are not known words count as absent); ties: frequency, then lookup order. (`written`, the
        word as written, is ContextRanker's.)
        Written here because symspellpy ranks by distance and frequency only (its compound lookup uses bigrams
        but rewrites spacing and is too slow: module docstring). A pair's count is the shipped bigram count, else what
        independence predicts (scale * count(first) * count(second) / total), capped at the list's cut and floored at 1;
        written out in the loop (it runs for every candidate), the operations in this order (same floats)."""
        total, floor, log = self._total, self._floor, math.log
        before_scale = self._scale * self._count(before) if before else 0.0
        after_count = self._count(after) if after else 0
        pairs = self._follows
        followers = pairs.get(before, _NO_PAIRS) if before else _NO_PAIRS
        best, best_score, best_count = None, None, None
        for term, count, raw, log_n, log_scale_n, scale_raw in found:
            # log P(w | before) + log P(after | w), without the terms all candidates share
            if before:
                left = followers.get(term)
                if left is None:
                    left = log(max(min(before_scale * raw / total, floor), 1.0))
            else:
                left = log_n
            if after:
                right = pairs.get(term, _NO_PAIRS).get(after)
                if right is None:
                    right = log(max(min(scale_raw * after_count / total, floor), 1.0))
                right -= log_scale_n
            else:
                right = 0.0
            score = left + right
            # max of (score, count, -position): a later candidate wins only by a higher score or, equal, count
            if best is None or score > best_score or (score == best_score and count > best_count):
                best, best_score, best_count = term, score, count
        return best


# Look-alike shapes (`ranking: context`): what OCR, a low-resolution scan or a glance reads one written shape as,
# written -> meant. Letter pairs and the digits that stand for letters, both ways; a candidate that the written word
# becomes by one or two of these rewrites is preferred (LOOKALIKE_BONUS), and joins the candidates even when it is
# farther than SymSpell's closest words (rnay -> may, beside ray and nay at one edit).
LOOKALIKES: tuple[tuple[str, str], ...] = (
    ("rn", "m"), ("m", "rn"), ("vv", "w"), ("w", "vv"), ("cl", "d"), ("d", "cl"), ("li", "h"), ("h", "li"),
    ("ri", "n"), ("ii", "u"), ("u", "ii"), ("nn", "m"), ("l", "i"), ("i", "l"), ("c", "e"), ("e", "c"),
    ("1", "l"), ("1", "i"), ("l", "1"), ("0", "o"), ("o", "0"), ("5", "s"), ("s", "5"), ("8", "b"), ("6", "b"),
    ("9", "g"), ("3", "e"), ("4", "a"), ("7", "t"),
)
LOOKALIKE_REWRITES = 2  # rewrites per word at most (m0dern -> modern takes one, rnodem -> modern two)
# Natural-log score added to a look-alike candidate: such a reading is taken unless its neighbours make another
# candidate 100 times as probable. Fixed before any measurement, as the OCR-shape prior; not tuned.
LOOKALIKE_BONUS = math.log(100)


def lookalike_spellings(word: str, rewrites: int = LOOKALIKE_REWRITES) -> frozenset[str]:
    """The spellings `word` becomes by 1 to `rewrites` look-alike rewrites (LOOKALIKES), each at any position."""
    found: set[str] = set()
    frontier = {word}
    for _ in range(rewrites):
        step = set()
        for spelling in frontier:
            for written, meant in LOOKALIKES:
                start = spelling.find(written)
                while start != -1:
                    step.add(spelling[:start] + meant + spelling[start + len(written):])
                    start = spelling.find(written, start + 1)
        step.discard(word)
        frontier = step - found
        found |= step
    return frozenset(found)


class ContextRanker(BigramRanker):
    """`ranking: context`: the bigram score between the neighbours, with in-domain pair counts added when the repair
    is given domain texts (`domain`), plus LOOKALIKE_BONUS for a candidate the written word becomes by look-alike rewrites; and
    a gate: the best candidate is taken only when its score beats the runner-up's by at least `gate` (natural log,
    so a gate of log 10 asks for ten times the probability), else the word is left as written."""

    def __init__(self, count: Callable[[str], int], words: dict[str, int], gate: float = 0.0,
                 domain: tuple[dict[str, dict[str, int]], int] | None = None):
        super().__init__(count, words)
        self.gate = float(gate)
        self._domain, domain_total = domain or ({}, 0)  # in-domain pairs (repair.domain_bigrams) and their total
        # an in-domain pair weighs as much of its corpus as a shipped pair of the shipped list: a 50/50 mixture
        self._domain_weight = _bigrams()[1] / domain_total if domain_total else 0.0
        self._lookalikes: dict[str, frozenset[str]] = {}

    def lookalikes(self, word: str) -> frozenset[str]:
        """lookalike_spellings(word), kept per word (bounded)."""
        hit = self._lookalikes.get(word)
        return hit if hit is not None else _remember(self._lookalikes, word, lookalike_spellings(word))

    def _pair(self, shipped_log: float | None, estimate: float, first: str, second: str) -> float:
        """log of a pair's count: the shipped count (else the independence estimate), plus the in-domain count."""
        count = math.exp(shipped_log) if shipped_log is not None else estimate
        if self._domain_weight:
            count += self._domain_weight * self._domain.get(first, _NO_PAIRS).get(second, 0)
        return math.log(count)

    def scores(self, found: tuple, before: str | None, after: str | None, written: str | None) -> list[tuple]:
        """(score, count, term) of each candidate of `prepared`'s `found`, best first (ties: the more frequent,
        then lookup order): BigramRanker.best's score, in-domain pairs and look-alikes added."""
        total, floor = self._total, self._floor
        before_scale = self._scale * self._count(before) if before else 0.0
        after_count = self._count(after) if after else 0
        followers = self._follows.get(before, _NO_PAIRS) if before else _NO_PAIRS
        shapes = self.lookalikes(written) if written else frozenset()
        out = []
        for position, (term, count, raw, log_n, log_scale_n, scale_raw) in enumerate(found):
            left = log_n
            if before:
                left = self._pair(followers.get(term), max(min(before_scale * raw / total, floor), 1.0), before, term)
            right = 0.0
            if after:
                right = self._pair(self._follows.get(term, _NO_PAIRS).get(after),
                                   max(min(scale_raw * after_count / total, floor), 1.0), term, after) - log_scale_n
            bonus = LOOKALIKE_BONUS if term in shapes else 0.0
            out.append((left + right + bonus, count, -position, term))
        out.sort(reverse=True)
        return [(score, count, term) for score, count, _, term in out]

    def best(self, found: tuple, before: str | None, after: str | None, written: str | None = None) -> str | None:
        """The best candidate (scores), or None to leave the word as written when the runner-up is within `gate`."""
        ranked = self.scores(found, before, after, written)
        if len(ranked) > 1 and ranked[0][0] - ranked[1][0] < self.gate:
            return None
        return ranked[0][2]
