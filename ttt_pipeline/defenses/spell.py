"""Spelling repair in front of the model: word-level SymSpell lookups on symspellpy's English dictionary.

Why word-level `lookup` (not `lookup_compound`): compound segmentation is far too slow for a test set and
rewrites spacing; per-word lookups with a per-word cache cost little once the review vocabulary is seen. The
lookups' answers are found, for all new words of a batch at once, by a whole-word delete index (_DeleteIndex):
the same words in the same order as symspellpy's `lookup`, several times faster than one pure-Python lookup per
word. Where only symspellpy's search knows the order (equal counts), its search runs over the closest words alone
(_tie_ordered), so its index of the whole shipped dictionary (2 s and 135 MB) loads only for edit distance 3 (a
training-vocabulary word over 64 letters sends a search to the vocabulary's own small SymSpell).
Only what is likely a typo is touched, so clean text passes through (almost) unchanged:

- the text is cut into word / non-word runs; punctuation, whitespace and numbers are copied verbatim;
- candidates are ASCII alphabetic words of 2+ letters (and, with `glyphs`, words of 3+ letters with a digit or two
  where letters belong: pr0duct, 9ood); other words with digits (mp3, 4th, 1080p), apostrophes (don't) or other
  scripts, mixed-case words (iPod, SanDisk: deliberate brand spellings) and all-caps words of up to 4
  letters (DVD, USB, HDMI: acronyms the dictionary lacks) are left as written;
- words in the dictionary or in the training vocabulary are kept, and so are contractions written without
  their apostrophe (dont, im): SymSpell would otherwise turn them into other words (done, in);
- runs of 3+ equal letters are cut to 2 first (goooood -> good: English has no triple letters);
- the correction is the closest word (TOP verbosity, ties by frequency), re-cased like the input
  (BATTRY -> BATTERY, Graet -> Great); words of 2-3 letters only accept 1 edit (2 edits reach too much).

Typo fixes beyond the closest word (`fixes`; DEFAULT_FIXES are the ones that passed bench/spell_repair.py's
check on training reviews, docs/benchmarks.md): `undouble` (letters doubled by a sticky key, written once when that
makes a known word: purchasseedd -> purchased), `case` (shift-key slips on a capitalised word: TThe -> The,
hTese -> These; other mixed case is still left alone), `real_word` (a dictionary word rarer than 10^7 whose
letters spell one 1,000x as frequent: rae -> are), `jumble_late` (inner letters shuffled, first and last kept,
when no word is within the edit distance: nveagite -> negative), `context` (when several words are equally close,
the one most probable between its neighbours by symspellpy's shipped bigram counts, instead of the most frequent:
"I ahd" -> "I had", not "and"; without known neighbours it is the most frequent, as before), `confusions` (the known
words one rewrite away that real misspellings show, learned from codespell's list of Wikipedia's common
misspellings: gud -> good, ocasion -> occasion; they join SymSpell's closest words and the neighbours rank them all;
an option until bench/spell_repair.py's rule adopts it), `glyphs` (a digit read as the letter it is confused with,
by OCR glyphs or a slipped key, when that spells a known word: pr0duct -> product, he11o -> hello; the pairs come
from this project's own `ocr` and `keyboard` families; a known word before trailing digits, as in ipod2, is left
as written). An option, not on by default (it failed the check: it costs keyboard typos): `jumble` (the same
before the closest-word lookup).

`extra_vocabulary` (training texts, words, or a word -> count mapping such as `defenses.vocabulary`'s) adds
the words seen at least `min_count` times that the dictionary lacks (product names, jargon, the domain's
slang) at a high frequency, so they survive and their misspellings are repaired towards them.
Deterministic: no randomness; ties go to the more frequent word, then symspellpy's stable order.
"""

from __future__ import annotations

import math
import re
import sys
from collections import Counter
from functools import lru_cache
from importlib import resources
from itertools import product
from typing import Callable, Iterable, Literal, Mapping

import numpy as np
from pydantic import Field
from rapidfuzz import process
from rapidfuzz.distance import OSA
from symspellpy import SymSpell, Verbosity

from ttt_pipeline.defenses.settings import DefenseSettings

__all__ = ["SpellRepair", "get_repair", "DICTIONARY"]

DICTIONARY = "frequency_dictionary_en_82_765.txt"
_PREFIX_LENGTH = 7  # symspellpy's prefix length for every search here (its default)
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


class Settings(DefenseSettings):
    """`ttt.spell.*`."""

    max_edit_distance: int = Field(2, ge=1, le=3, description="Largest edit distance of a repair.")
    vocabulary: Literal["train", "none"] = Field(
        "train", description="train: also trust the words of the training texts (seen at least twice), so product "
        "names survive; none: the shipped English dictionary only.")
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


# --- The closest dictionary words, as symspellpy's lookup(word, CLOSEST, limit) finds them, for limit 1 or 2.
# Both use the symmetric-delete idea: two words within k edits (Damerau OSA: substitute, insert, delete, swap two
# neighbours) share a spelling with at most k letters deleted from each. symspellpy keys its index by the deletes of
# a word's first 7 letters only, so one lookup meets hundreds of long words sharing a prefix and measures each in
# pure Python (most of repair's time on typos). _DeleteIndex keys every word by the deletes of the whole word, looks
# up a whole batch of words in a few array operations, keeps the pairs whose deleted positions an edit can explain
# (_explained) and measures only those, all in one call (_osa_within; distance 1 first: CLOSEST keeps only the
# nearest).
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
_NO_PAIRS: dict[str, float] = {}  # a word no bigram starts with


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
        if self._context:
            self._follows, pairs_total, self._floor = _bigrams()
            self._total = sum(self._words.values())
            self._scale = pairs_total / self._total  # bigram per unigram count: the lists come from different corpora
        # Caches, each bounded by _CACHE_LIMIT (outputs never depend on them: every entry is a pure function of
        # its key): lower-case word -> correction (_correct); word as written -> its repair, or (word, candidates)
        # when neighbours choose (_resolve); (word, before, after) -> the repair chosen between those neighbours.
        self._cache: dict[str, str | tuple | None] = {}
        self._tokens: dict[str, str | tuple[str, tuple]] = {}
        self._ranks: dict[tuple[str, str | None, str | None], str] = {}
        self._stats: dict[str, tuple] = {}  # candidate -> _term_stats

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
        if len(found) > 1 and self._context:
            return found  # ranked per occurrence, by its neighbours (_ranked)
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

    def _prepared(self, found: tuple) -> tuple:
        """found's (term, count), each with what _ranked needs of it whatever the neighbours (_term_stats); one
        stored tuple per term, reused by every misspelling it is a candidate of (the count is the term's own)."""
        stats, term_stats = self._stats, self._term_stats
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
        return _remember(self._stats, term, (term, count, raw, math.log(n), math.log(self._scale * n),
                                             self._scale * raw))

    def _ranked(self, found: tuple, before: str | None, after: str | None) -> str:
        """The candidate (of _prepared's `found`) most probable between its neighbours, P(w | before) P(after | w)
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

    def _neighbour(self, word: str | None) -> str | None:
        """A context word for _ranked: a known word with a count, lower-cased, or None."""
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
        """Caches _correct's answer for `low` (candidates prepared for _ranked); returns what was cached."""
        return _remember(self._cache, low, self._prepared(fixed) if isinstance(fixed, tuple) else fixed)

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


def build(settings: Settings, context: dict) -> Callable[[list[str]], list[str]]:
    """The registry's constructor for a text repair: `ttt.spell.max_edit_distance`, and the training vocabulary
    when the context has one (`context["vocabulary"]`) and `ttt.spell.vocabulary` is train."""
    vocabulary = context.get("vocabulary") if settings.vocabulary == "train" else None
    return SpellRepair(max_edit_distance=settings.max_edit_distance, extra_vocabulary=vocabulary).repair_all
