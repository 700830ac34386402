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

    def best(self, found: tuple, before: str | None, after: str | None) -> str:
        """The candidate (of `prepared`'s `found`) most probable between its neighbours, P(w | before) P(after | w)
        (neighbours that are not known words count as absent); ties: frequency, then lookup order.
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

