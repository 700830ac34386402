"""The closest dictionary words, as symspellpy's lookup(word, CLOSEST, limit) finds them, for limit 1 or 2.

Both use the symmetric-delete idea: two words within k edits (Damerau OSA: substitute, insert, delete, swap two
neighbours) share a spelling with at most k letters deleted from each. symspellpy keys its index by the deletes of
a word's first 7 letters only, so one lookup meets hundreds of long words sharing a prefix and measures each in
pure Python (most of repair's time on typos). _DeleteIndex keys every word by the deletes of the whole word, looks
up a whole batch of words in a few array operations, keeps the pairs whose deleted positions an edit can explain
(_explained) and measures only those, all in one call (_osa_within; distance 1 first: CLOSEST keeps only the
nearest)."""

from __future__ import annotations

from functools import lru_cache
from typing import Mapping

import numpy as np
from rapidfuzz import process
from rapidfuzz.distance import OSA
from symspellpy import SymSpell, Verbosity

from ttt_pipeline.defenses.spell.dictionary import _PREFIX_LENGTH, EXTRA_COUNT, _base, _counts

_HASH_BASE = 0x100000001B3  # a spelling's key: sum of code point * base**position, modulo 2**64 (base odd: invertible)
_HASH_INV = pow(_HASH_BASE, -1, 1 << 64)
_PAIRS: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # n -> (j, k): the position pairs j < k of an n-letter word
_INDEXED = 64  # longest word indexed (a word has n * n / 2 deletes); longer ones, and the searches that could reach
# them, are symspellpy's (its prefix index does not grow with length; the shipped dictionary's longest word has 28)


def _delete_hashes(words: list[str], depths: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """(hash, owner, first, second) of each word's spellings with `depths` (0, 1, 2) letters deleted: owner is the
    word's position in `words`, first < second the deleted positions (-1: none). Computed per word length on arrays:
    from a word's prefix sums P, deleting j gives P[j] + (P[n] - P[j + 1]) / base, deleting j < k gives
    P[j] + (P[k] - P[j + 1]) / base + (P[n] - P[k + 1]) / base**2 (/: times the inverse; uint64 wraps modulo 2**64)."""
    by_length: dict[int, list[int]] = {}
    for i, w in enumerate(words):
        by_length.setdefault(len(w), []).append(i)
    inv, inv2 = np.uint64(_HASH_INV), np.uint64(_HASH_INV * _HASH_INV % (1 << 64))
    parts: list[tuple[np.ndarray, ...]] = []
    for n, positions in by_length.items():
        codes = np.frombuffer("".join([words[i] for i in positions]).encode("utf-32-le", "surrogatepass"), np.uint32)
        powers = np.array([pow(_HASH_BASE, i, 1 << 64) for i in range(n)], dtype=np.uint64)
        pre = np.zeros((len(positions), n + 1), dtype=np.uint64)
        np.cumsum(codes.reshape(len(positions), n) * powers, axis=1, out=pre[:, 1:])
        full, none = pre[:, n:], np.full(1, -1, dtype=np.int8)  # positions: words are at most _INDEXED long
        found = [(full, none, none)] if 0 in depths else []
        if 1 in depths:
            found.append((pre[:, :n] + (full - pre[:, 1:]) * inv, np.arange(n, dtype=np.int8), np.full(n, -1, np.int8)))
        if 2 in depths and n >= 2:
            if n not in _PAIRS:
                _PAIRS[n] = tuple(a.astype(np.int8) for a in np.triu_indices(n, 1))
            j, k = _PAIRS[n]
            found.append((pre[:, j] + (pre[:, k] - pre[:, j + 1]) * inv + (full - pre[:, k + 1]) * inv2, j, k))
        owners = np.asarray(positions, dtype=np.int32)
        for h, first, second in found:
            parts.append((h.ravel(), np.repeat(owners, h.shape[1]), np.tile(first, len(owners)),
                          np.tile(second, len(owners))))
    if not parts:
        return np.zeros(0, np.uint64), np.zeros(0, np.int32), np.zeros(0, np.int8), np.zeros(0, np.int8)
    return tuple(np.concatenate(column) for column in zip(*parts))


def _flat_codes(words: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The code points of all words end to end (one spare at each end), and where each word starts."""
    lengths = np.fromiter((len(w) for w in words), dtype=np.int64, count=len(words))
    starts = np.cumsum(lengths) - lengths + 1
    return np.frombuffer(("\0" + "".join(words) + "\0").encode("utf-32-le", "surrogatepass"), np.uint32), starts


# Spreads the keys over the top bits, which pick a bucket (_Level): a short spelling's key is small (one letter:
# its code point). Multiplying by an odd number modulo 2**64 is one-to-one, so equal keys stay equal, others apart.
_MIX = np.uint64(0x9E3779B97F4A7C15)


class _Level:
    """Words under the hashes of some of their deletes, sorted by hash, with the deleted positions; `starts[b]` is
    where bucket b (a hash's top bits) begins, about one entry per bucket: a lookup costs two array reads, not a
    binary search over millions of hashes (repair's time on new words)."""

    def __init__(self, hashes: np.ndarray, owners: np.ndarray, first: np.ndarray, second: np.ndarray):
        hashes = hashes * _MIX
        order = np.argsort(hashes)
        self.hashes, self.rows, self.first, self.second = hashes[order], owners[order], first[order], second[order]
        bits = max(1, len(hashes).bit_length() - 1)  # 2**bits buckets: one or two entries each
        self.shift = np.uint64(64 - bits)
        lower = np.arange(2 ** bits, dtype=np.uint64) << self.shift  # each bucket's smallest hash
        self.starts = np.append(self.hashes.searchsorted(lower), len(hashes)).astype(np.int32)  # 4 bytes a bucket

    def pairs(self, hashes, owners, first, second) -> tuple[np.ndarray, ...]:
        """(owner, word position, the owner's deleted positions, the word's) for every word indexed under one
        of the owners' delete `hashes` (with `first`, `second` its deleted positions), grouped by hash."""
        hashes = hashes * _MIX
        bucket = (hashes >> self.shift).astype(np.int64)
        lo, hi = self.starts[bucket].astype(np.int64), self.starts[bucket + 1].astype(np.int64)
        sizes = hi - lo  # the bucket's entries; those with the query's hash are kept
        ends = np.cumsum(sizes)
        at = np.arange(ends[-1] if len(ends) else 0) + np.repeat(lo - ends + sizes, sizes)
        query = np.repeat(np.arange(len(hashes)), sizes)  # the query each entry was found for
        same = self.hashes[at] == hashes[query]
        query, at = query[same], at[same]
        return owners[query], self.rows[at], first[query], second[query], self.first[at], self.second[at]


def _explained(qf, qs, wf, ws, same_f, same_s, k: int) -> np.ndarray:
    """Whether a shared delete (query deleted qf < qs, word wf < ws; -1: none) can come from k edits or fewer.
    An alignment's edits each delete at most one letter per side: a substitution the same position on both sides, a
    swap of i, i+1 one of them on each side (1 apart, the same letter: same_f / same_s say whether the first / second
    deleted letters are equal), an insertion one letter on one side. So words within k edits share a delete with:
    1 letter on one side only; or with k = 1, one on each, the same position or a swap; or with k = 2, up to 2 + 0
    or 1 + 1 (always within 2: a deletion and an insertion, or edits 1 apart), 1 + 2 with the one within 1 of either
    of the two, 2 + 2 each (sorted) the same position or a swap. A necessary test: the pairs kept are measured."""
    dq, dw = (qf >= 0).astype(np.int8) + (qs >= 0), (wf >= 0).astype(np.int8) + (ws >= 0)
    near_f = np.abs(qf - wf) <= 1
    first = (qf == wf) | (near_f & same_f)  # a substitution or a swap
    if k == 1:
        return (dq + dw == 1) | ((dq == 1) & (dw == 1) & first)
    keep = (dq + dw <= 2) | ((dq == 2) & (dw == 2) & first & ((qs == ws) | ((np.abs(qs - ws) == 1) & same_s)))
    keep |= (dq == 1) & (dw == 2) & (near_f | (np.abs(qf - ws) <= 1))
    keep |= (dq == 2) & (dw == 1) & (near_f | (np.abs(qs - wf) <= 1))
    return keep


def _osa_within(a: list[str], b: list[str], k: int) -> np.ndarray:
    """Whether each pair a[i], b[i] is within k edits by Damerau OSA distance (symspellpy's measure), all pairs in
    one C++ call: rapidfuzz is the maintained implementation of that distance, in place of this module's own
    per-pair checks in Python (a test checks it agrees with symspellpy's DamerauOsa on every pair of short strings)."""
    return process.cpdist(a, b, scorer=OSA.distance, score_cutoff=k) <= k


class _DeleteIndex:
    """The words of one dictionary (word -> count) under each spelling with up to `depth` (1 or 2) letters deleted
    (as hashes: a collision only adds a candidate, and every candidate is measured)."""

    def __init__(self, counts: Mapping[str, int], max_edit_distance: int):
        self.counts = counts
        self.words = [w for w in counts if len(w) <= _INDEXED]  # in the dictionary's order: symspellpy's (_tie_ordered)
        self.longest = max(map(len, counts), default=0)  # a search that could reach a longer word is not ours
        self.max_edit_distance = max_edit_distance  # the dictionary's, as symspellpy's search would hold it
        self.depth = min(max_edit_distance, 2)
        self._counts = np.fromiter((counts[w] for w in self.words), dtype=np.int64, count=len(self.words))
        self._letters, self._starts = _flat_codes(self.words)
        self._near = _Level(*_delete_hashes(self.words, (0, 1)))  # the word and its 1-letter deletes
        self._far = _Level(*_delete_hashes(self.words, (2,))) if self.depth == 2 else None  # its 2-letter deletes

    def closest(self, queries: list[str], limits: list[int]) -> list[tuple[int, tuple, list | None]]:
        """For each query word (not in the dictionary; limit <= depth): (d, (word, count) of the words at Damerau
        OSA distance d, most frequent first, and where two counts are equal the same in the dictionary's order, else
        None) for the smallest d in 1..limit that has any, else (0, (), None)."""
        out: list = [(0, (), None)] * len(queries)
        up_to_1 = _delete_hashes(queries, (0, 1))
        for q, (found, load) in self._measure(queries, 1, [self._near.pairs(*up_to_1)]).items():
            out[q] = (1, found, load)
        again = [q for q, limit in enumerate(limits) if limit >= 2 and not out[q][1]]
        if again:  # no word within 1 edit: the words found within 2 are at 2
            back = np.asarray(again, dtype=np.int32)
            up_to_1 = _delete_hashes([queries[q] for q in again], (0, 1))
            exactly_2 = _delete_hashes([queries[q] for q in again], (2,))
            up_to_1 = (up_to_1[0], back[up_to_1[1]], *up_to_1[2:])
            exactly_2 = (exactly_2[0], back[exactly_2[1]], *exactly_2[2:])
            pairs = [self._near.pairs(*up_to_1), self._near.pairs(*exactly_2), self._far.pairs(*up_to_1),
                     self._far.pairs(*exactly_2)]
            for q, (found, load) in self._measure(queries, 2, pairs).items():
                out[q] = (2, found, load)
        return out

    def _measure(self, queries: list[str], k: int, pairs: list[tuple[np.ndarray, ...]]) -> dict[int, tuple]:
        """query -> ((word, count) of the words within k edits of it, most frequent first; where two counts are
        equal, the same in the dictionary's order, else None), among the `pairs` (_Level.pairs) _explained keeps."""
        owners, rows, qf, qs, wf, ws = (np.concatenate(column) for column in zip(*pairs))
        owners, rows = owners.astype(np.int64), rows.astype(np.int64)
        letters, starts = _flat_codes(queries)  # the letters each side deleted (at -1: a spare, not used then)
        at_q, at_w = starts[owners], self._starts[rows]
        same_f = letters[at_q + qf] == self._letters[at_w + wf]
        same_s = letters[at_q + qs] == self._letters[at_w + ws]
        keep = _explained(qf, qs, wf, ws, same_f, same_s, k)
        key = np.unique(owners[keep] * len(self.words) + rows[keep])
        owners, rows = key // len(self.words), key % len(self.words)
        words = self.words
        ok = _osa_within([queries[q] for q in owners.tolist()], [words[r] for r in rows.tolist()], k)
        owners, rows = owners[ok], rows[ok]
        counts = self._counts[rows]
        order = np.lexsort((-counts, owners))  # by query, then most frequent first
        owners, rows, counts = owners[order], rows[order], counts[order]
        tied = set(owners[1:][(owners[1:] == owners[:-1]) & (counts[1:] == counts[:-1])].tolist())
        # tuples, not lists: Python's collector stops tracking a tuple of strings and numbers, so the answers a
        # repair holds on to do not count towards its full collections (_vocabulary_dictionary)
        items = tuple(zip([words[r] for r in rows.tolist()], counts.tolist()))
        if not items:
            return {}
        bounds = [0, *(np.flatnonzero(owners[1:] != owners[:-1]) + 1).tolist(), len(items)]  # one run per query
        out = {}
        for q, a, b in zip(owners[bounds[:-1]].tolist(), bounds, bounds[1:]):
            # ties: rare but among vocabulary words (they share one count); rows are in the dictionary's order
            load = [(words[r], int(self._counts[r])) for r in sorted(rows[a:b].tolist())] if q in tied else None
            out[q] = (items[a:b], load)
        return out


def _closest(index: _DeleteIndex, sym: SymSpell | None,
             queries: list[tuple[str, int]]) -> list[tuple[int, tuple, list | None]]:
    """For each (word, limit): (distance, (term, count) of the closest words, most frequent first; where two counts
    are equal the same in the dictionary's order, else None) as symspellpy's lookup(word, Verbosity.CLOSEST, limit)
    over index's words finds them (no words: distance 0). `index` answers in one batch; symspellpy's search itself
    (`sym`, or the shipped dictionary's, _base) for a word in the dictionary, limit > 2 or a search that could reach
    a word longer than _INDEXED (then in its order: None)."""
    out: list = [None] * len(queries)
    mine = []
    for q, (word, limit) in enumerate(queries):
        if len(word) - limit > index.longest:
            out[q] = (0, (), None)  # nothing that long (symspellpy's first check)
        elif limit <= index.depth and word not in index.counts and (
                index.longest <= _INDEXED or len(word) + limit <= _INDEXED):
            mine.append(q)
    for q, found in zip(mine, index.closest([queries[q][0] for q in mine], [queries[q][1] for q in mine])):
        out[q] = found
    for q, (word, limit) in enumerate(queries):
        if out[q] is None:
            out[q] = (*_lookup(sym if sym is not None else _base(index.max_edit_distance), word, limit), None)
    return out


def _tie_ordered(index: _DeleteIndex, sym: SymSpell | None, word: str, limit: int,
                 load: list[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    """The closest words of `word` (`load`: all of them, in the dictionary's order) in symspellpy's lookup order,
    which breaks ties of equal count by the order its search meets them in: `sym`'s search where one is loaded,
    else a search over these words alone, which keeps the whole dictionary's order because a farther word (at
    `limit`, where the search starts, for limits 1 and 2) never changes what the search does with a closest one
    (tests/defenses/test_spell.py checks it against the whole dictionary's search)."""
    if sym is None:
        sym = SymSpell(max_dictionary_edit_distance=index.max_edit_distance, prefix_length=_PREFIX_LENGTH)
        for term, count in load:
            sym.create_dictionary_entry(term, count)
    return _lookup(sym, word, limit)[1]


def _lookup(sym: SymSpell, word: str, limit: int) -> tuple[int, tuple[tuple[str, int], ...]]:
    """symspellpy's own answer: (distance, (term, count) of the closest words in its order); no words: (0, ())."""
    items = sym.lookup(word, Verbosity.CLOSEST, max_edit_distance=limit)
    return (items[0].distance if items else 0), tuple((f.term, f.count) for f in items)


@lru_cache(maxsize=4)
def _base_index(max_edit_distance: int) -> _DeleteIndex:
    """_DeleteIndex of the shipped dictionary (0.7 s and 90 MB, once per edit distance)."""
    return _DeleteIndex(_counts(), max_edit_distance)


@lru_cache(maxsize=4)
def _vocabulary_dictionary(words: tuple[str, ...], max_edit_distance: int) -> tuple[SymSpell, _DeleteIndex]:
    """The training vocabulary's words (each at EXTRA_COUNT) as symspellpy's dictionary and as a _DeleteIndex, shared
    by the repairs built on one vocabulary (the evaluate step builds one per method) and never mutated, like the
    shipped one's. Sharing it also keeps symspellpy's thousands of delete lists from being built again for each
    repair: they outlive it long enough to count towards Python's full garbage collections (each one walks every
    tracked object of the process, about 0.1 s beside torch)."""
    sym = SymSpell(max_dictionary_edit_distance=max_edit_distance, prefix_length=_PREFIX_LENGTH)
    for w in words:
        sym.create_dictionary_entry(w, EXTRA_COUNT)
    return sym, _DeleteIndex(sym.words, max_edit_distance)

