"""SpellRepair: typos fixed, everything else kept byte for byte, training vocabulary respected, fast enough."""

from __future__ import annotations

import itertools
import random
import string
import subprocess
import sys
import time

import numpy as np
import pytest
from symspellpy import SymSpell, Verbosity
from symspellpy.editdistance import DamerauOsa

from ttt_pipeline.corruption import corrupt_texts
from ttt_pipeline.corruption.samples import synthetic_reviews
from ttt_pipeline.defenses import spell
from ttt_pipeline.defenses.spell import SpellRepair, get_repair, vocabulary_counts


@pytest.fixture(scope="module")
def repair() -> SpellRepair:
    return SpellRepair()


def test_typos_fixed(repair):
    assert repair.repair("the battry is graet") == "the battery is great"


def test_casing_punctuation_numbers_kept(repair):
    assert repair.repair("The BATTRY lasted 10 hours!!") == "The BATTERY lasted 10 hours!!"
    assert repair.repair("Graet  sound,\tteh best\n") == "Great  sound,\tthe best\n"


def test_clean_text_unchanged(repair):
    text = "I bought this radio in 2004 , and it still works : the sound is clear and the remote is fine."
    assert repair.repair(text) == text


def test_left_as_written(repair):
    """Digits, apostrophes, mixed case, acronyms, bare contractions, 1-letter and non-ASCII words."""
    text = "mp3 2nd don't it’s iPod USB HDMI dont im x q café"
    assert repair.repair(text) == text


def test_repeated_letters(repair):
    assert repair.repair("goood and sooooo loooong") == "good and so long"


def test_short_words_take_one_edit(repair):
    assert repair.repair("teh") == "the"
    assert repair.repair("xqz") == "xqz"  # nothing within 1 edit: kept


def test_training_vocabulary_keeps_a_product_name():
    text = "My Netgear router"
    assert SpellRepair().repair(text) == "My Nether router"  # without it the brand becomes a dictionary word
    train = ["the netgear box", "Netgear support was slow", "one mention of Vonage"]
    with_vocab = SpellRepair(extra_vocabulary=train)
    assert with_vocab.repair(text) == text
    assert with_vocab.repair("My Netgeer router") == text  # misspellings repaired towards it
    assert "netgear" in with_vocab.extra_words and "vonage" not in with_vocab.extra_words  # min_count 2
    assert SpellRepair(extra_vocabulary=train, min_count=1).repair("Vonage") == "Vonage"
    assert SpellRepair().repair("Vonage") == "Voyage"


def test_vocabulary_counts_words_of_texts():
    counts = vocabulary_counts(["The netgear, the NETGEAR 2x don't", "x"])
    assert counts == {"the": 2, "netgear": 2}


def test_stored_vocabulary_mapping_keeps_its_counts():
    """A word -> count mapping (the stored training vocabulary) is not re-counted: each key counts n times."""
    stored = {"netgear": 2, "mp3": 5, "don't": 9, "vonage": 1}
    assert vocabulary_counts(stored) == {"netgear": 2, "vonage": 1}
    repair = SpellRepair(extra_vocabulary=stored)
    assert repair.extra_words == {"netgear"}  # vonage is below min_count 2
    assert repair.repair("My Netgear router, Vonage") == "My Netgear router, Voyage"


def test_deterministic():
    texts = corrupt_texts(synthetic_reviews(20, seed=3), "tutorial", 3, 42).texts
    first = SpellRepair().repair_all(texts)
    assert first == SpellRepair().repair_all(texts) == SpellRepair().repair_all(list(reversed(texts)))[::-1]
    assert first != texts


def test_get_repair_is_shared():
    assert get_repair() is get_repair()
    a = get_repair(extra_texts_digest="abc", extra_vocabulary=["netgear netgear"])
    assert get_repair(extra_texts_digest="abc", extra_vocabulary=["netgear netgear"]) is a
    assert a.repair("Netgear") == "Netgear"


def test_speed(repair):
    """A lenient floor, cold word cache (bench/spell_repair.py times real MDSD reviews)."""
    texts = corrupt_texts(synthetic_reviews(200, seed=1), "tutorial", 3, 42).texts
    fresh = SpellRepair()  # empty word cache (the dictionary is shared, loaded by the fixture)
    start = time.perf_counter()
    out = fresh.repair_all(texts)
    rate = len(texts) / (time.perf_counter() - start)
    assert len(out) == 200 and rate > 50, f"{rate:.0f} reviews/s"


def _sample() -> list[str]:
    clean = synthetic_reviews(150, seed=5)
    return (clean + corrupt_texts(clean, "tutorial", 4, 11).texts + corrupt_texts(clean, "keyboard", 4, 12).texts
            + ["I ahd a good time", "ths is great", "Tis is good", "I, ahd", "TThe BATTRY  goooood\tteh"])


def test_caches_change_no_output(monkeypatch):
    """Every cache (word, token, word between neighbours) gives what repairing without caches gives: with a
    limit of one entry, every cache is emptied at each new entry, so each token is resolved afresh."""
    texts = _sample()
    cached = SpellRepair()
    first = cached.repair_all(texts)
    assert cached.repair_all(texts) == first  # a second, fully cached pass
    assert cached._ranks and cached._tokens and cached._cache
    monkeypatch.setattr(spell.cache, "_CACHE_LIMIT", 1)
    uncached = SpellRepair()
    assert uncached.repair_all(texts) == first
    assert max(len(uncached._ranks), len(uncached._tokens), len(uncached._cache)) <= 1
    assert first[-5:] == ["I had a good time", "this is great", "This is good", "I, and", "The BATTERY  good\tthe"]


def test_caches_are_bounded(monkeypatch):
    monkeypatch.setattr(spell.cache, "_CACHE_LIMIT", 50)
    texts = _sample()
    repair = SpellRepair()
    sizes = []
    for t in texts:
        repair.repair(t)
        sizes.append(max(len(repair._ranks), len(repair._tokens), len(repair._cache)))
    assert max(sizes) == 50
    assert repair.repair_all(texts) == SpellRepair().repair_all(texts)  # cleared and refilled: same outputs


def test_warm_speed(repair):
    """A lenient floor on a warm cache (the shared repair from batch to batch; bench/spell_repair.py records the
    figures: thousands of reviews/s once the words were seen)."""
    texts = synthetic_reviews(200, seed=1)
    fresh = SpellRepair()
    fresh.repair_all(texts)
    start = time.perf_counter()
    fresh.repair_all(texts)
    rate = len(texts) / (time.perf_counter() - start)
    assert rate > 1000, f"{rate:.0f} reviews/s"


# --- typo fixes beyond SymSpell's closest word (DEFAULT_FIXES, chosen by bench/spell_repair.py's rule)
@pytest.mark.parametrize("typo, fixed", [
    ("purchasseedd", "purchased"),  # undouble: three doubled letters, beyond 2 edits
    ("TThe", "The"), ("hTese", "These"), ("tI", "It"), ("oNt", "Not"),  # case: shift-key slips
    ("rae", "are"),  # real_word: a rare dictionary word whose letters spell a far more frequent one
    ("nveagite", "negative"), ("tugohht", "thought"),  # jumble_late: inner letters shuffled, nothing closer
])
def test_default_fixes(repair, typo, fixed):
    assert repair.repair(typo) == fixed
    assert SpellRepair(fixes=()).repair(typo) != fixed  # the plain closest-word lookup misses each of them


@pytest.mark.parametrize("typo, fixed", [
    ("pr0duct", "product"), ("he11o", "hello"), ("9ood", "good"), ("1ove", "love"),  # OCR glyphs: 0 o, 1 l, 9 g
    ("Pr0duct", "Product"), ("PR0DUCT", "PRODUCT"), ("w1th", "with"),  # re-cased; 1 for i (OCR) too
    ("h4lp", "help"), ("s7re", "sure"),  # slipped keys: 4 is next to e, 7 next to u
])
def test_glyphs_read_digits_as_the_letters_they_stand_for(repair, typo, fixed):
    assert repair.repair(f"a {typo} here") == f"a {fixed} here"
    assert SpellRepair(fixes=[f for f in spell.DEFAULT_FIXES if f != "glyphs"]).repair(typo) == typo


def test_glyphs_leave_numbers_units_and_model_names():
    """Numbers with units, model names and a known word before a number are not glyph typos."""
    text = "mp3 ps4 4th 2nd 80s 1080p 64gb sd850 x100 ipod2 the2 10 12.5 b00k"
    assert SpellRepair().repair(text) == text


def test_digit_letters_come_from_the_own_ocr_and_keyboard_families():
    from ttt_pipeline.corruption.characters import KEYBOARD_NEIGHBOURS, OCR_SINGLE

    table = spell.dictionary._digit_letters()
    assert table["0"] == "op" and table["1"] == "ilq" and table["9"] == "gio"
    for letter, written in [*OCR_SINGLE.items(), *KEYBOARD_NEIGHBOURS.items()]:
        for digit in (c for c in written if c.isdigit() and letter.isalpha()):
            assert letter.lower() in table[digit]


def test_fixes_leave_deliberate_spellings(repair):
    """Brand casing, common dictionary words and words with a closer correction are not touched by the fixes."""
    text = "iPod SanDisk eBay sue greta The battery is great, I use it daily."
    assert repair.repair(text) == text
    assert repair.repair("battry") == "battery"  # the closest word still wins before any jumble


def test_fix_options_are_checked():
    with pytest.raises(ValueError, match="unknown spell fixes"):
        SpellRepair(fixes=["undouble", "nope"])
    assert SpellRepair(fixes=["jumble"]).repair("hdnaest") == "handset"  # measured, not on by default
    assert SpellRepair().repair("hdnaest") == "honest"  # the default keeps the closest word first


# --- context: equally close candidates ranked by their neighbours (symspellpy's bigram counts)
@pytest.mark.parametrize("typo, fixed", [
    ("I ahd a good time", "I had a good time"),  # frequency alone: "and"
    ("I want to bu this", "I want to buy this"),  # "by"
    ("ths is great", "this is great"),  # "the"
    ("kidn of nice", "kind of nice"),  # "kids"
    ("Tis is good", "This is good"),  # "Is", re-cased
])
def test_context_ranks_equally_close_words_by_their_neighbours(repair, typo, fixed):
    assert repair.repair(typo) == fixed
    assert SpellRepair(fixes=("undouble", "case", "real_word", "jumble_late")).repair(typo) != fixed


def test_context_needs_neighbours_across_spaces_only(repair):
    """Alone, or with punctuation between, a word has no neighbour: the most frequent candidate, as before."""
    assert repair.repair("ahd") == "and"
    assert repair.repair("I, ahd") == "I, and"
    assert repair.repair("I ahd") == "I had"
    text = "The battery is great, I use it daily and it has a good time."
    assert repair.repair(text) == text  # clean text passes through unchanged


# --- the closest-word search (_DeleteIndex, batched): symspellpy's lookup answers, in its order, much faster
def _symspellpy_candidates(repair: SpellRepair, queries: list[tuple[str, int]]) -> list[tuple]:
    """What SpellRepair._candidates gave before the index: each dictionary's lookup, the nearest kept."""
    out = []
    for word, limit in queries:
        found = [(f.term, f.distance, f.count) for sym in (spell.dictionary._base(repair.max_edit_distance), repair._extra)
                 if sym is not None
                 for f in sym.lookup(word, Verbosity.CLOSEST, max_edit_distance=limit)]
        nearest = min((d for _, d, _ in found), default=0)
        out.append(tuple((term, count) for term, d, count in found if d == nearest))
    return out


def _typos(words: list[str], n: int, seed: int) -> set[str]:
    """Each of n random words with 1 to 3 random substitutions, insertions, deletions or swaps."""
    rng, letters, out = random.Random(seed), string.ascii_lowercase, set()
    for word in rng.choices(words, k=n):
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(word))
            word = rng.choice([word[:i] + rng.choice(letters) + word[i + 1:], word[:i] + rng.choice(letters) + word[i:],
                               word[:i] + word[i + 1:], word[:i] + word[i + 1:i + 2] + word[i] + word[i + 2:]])
        if len(word) >= 2:
            out.add(word)
    return out


def test_within_is_symspellpy_damerau_osa():
    """_osa_within (rapidfuzz's OSA) agrees with symspellpy's measured distance at k = 1 and 2, on every pair of
    short strings of 3 letters."""
    strings = [""] + ["".join(t) for n in range(1, 6) for t in itertools.product("abc", repeat=n)]
    osa = DamerauOsa()
    pairs = [(a, b) for a in strings for b in strings if abs(len(a) - len(b)) <= 3]
    d = np.array([osa.distance(a, b, 2) for a, b in pairs])
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    assert len(pairs) > 100_000 and set(d.tolist()) == {-1, 0, 1, 2}
    for k in (1, 2):
        assert (spell.index._osa_within(a, b, k) == ((0 <= d) & (d <= k))).all()


@pytest.mark.parametrize("max_edit_distance", [1, 2])
def test_closest_words_are_symspellpy_lookups(max_edit_distance):
    """Same words, same order, on typos (1 to 3 edits) of dictionary words, every 2-letter string, and typos of
    vocabulary words that share one count (symspellpy's search order breaks those ties: it answers them)."""
    vocabulary = ["zorbix zorbex zorbax quandle quindle frobnitz"] * 2
    repair = SpellRepair(max_edit_distance=max_edit_distance, extra_vocabulary=vocabulary)
    words = sorted(w for w in repair._words if w.isalpha() and len(w) >= 2)
    queries = _typos(words, 1500, seed=max_edit_distance) | _typos(sorted(repair.extra_words), 60, seed=7)
    queries |= {"".join(t) for t in itertools.product(string.ascii_lowercase, repeat=2)} | {"zorbux", "qundle"}
    queries = sorted((q, 1 if len(q) <= 3 else max_edit_distance) for q in queries if not repair._known(q))
    found = repair._candidates(queries)
    assert found == _symspellpy_candidates(repair, queries)
    assert sum(len(f) > 1 for f in found) > 100 and any(len(f) > 1 and f[0][1] == f[1][1] for f in found)


@pytest.mark.parametrize("max_edit_distance", [2, 3])
def test_ties_are_ordered_as_the_whole_dictionarys_search_orders_them(max_edit_distance):
    """Where closest words share a count, _tie_ordered's search over those words alone gives the order of symspellpy's
    search over the whole shipped dictionary (which then need not load): every 2- and 3-letter string and typos of
    dictionary words, at limits 1 and 2."""
    index = spell.index._base_index(max_edit_distance)
    words = sorted(w for w in spell.dictionary._counts() if w.isalpha() and len(w) >= 4)
    strings = {"".join(t) for n in (2, 3) for t in itertools.product(string.ascii_lowercase, repeat=n)}
    queries = [(q, limit) for q in sorted(strings | _typos(words, 4000, seed=11)) if q not in spell.dictionary._counts()
               for limit in (1, 2)]
    tied = [(q, found) for q, found in zip(queries, spell.index._closest(index, None, queries)) if found[2] is not None]
    full = spell.dictionary._base(max_edit_distance)
    assert len(tied) >= 20
    for (word, limit), (_, _, load) in tied:
        expected = tuple((f.term, f.count) for f in full.lookup(word, Verbosity.CLOSEST, max_edit_distance=limit))
        assert spell.index._tie_ordered(index, None, word, limit, load) == expected, word


@pytest.mark.parametrize("max_edit_distance", [1, 2, 3])
def test_ties_keep_the_whole_searchs_order_where_every_count_is_equal(max_edit_distance):
    """The same under heavy ties: 3,000 real words sharing one count (as vocabulary words do), so every answer of
    two or more words is a tie; typos of them at limits 1 and 2 (only 1 at edit distance 1)."""
    rng = random.Random(5)
    words = sorted(rng.sample(sorted(w for w in spell.dictionary._counts() if w.isalpha() and 2 <= len(w) <= 12), 3000))
    full = SymSpell(max_dictionary_edit_distance=max_edit_distance, prefix_length=spell.dictionary._PREFIX_LENGTH)
    for w in words:
        full.create_dictionary_entry(w, 1000)
    index = spell.index._DeleteIndex(full.words, max_edit_distance)
    queries = [(q, limit) for q in sorted(_typos(words, 8000, seed=max_edit_distance) - set(words))
               for limit in sorted({1, min(2, max_edit_distance)})]
    tied = [(q, found) for q, found in zip(queries, spell.index._closest(index, None, queries)) if found[2] is not None]
    assert len(tied) > 100
    for (word, limit), (_, _, load) in tied:
        expected = tuple((f.term, f.count) for f in full.lookup(word, Verbosity.CLOSEST, max_edit_distance=limit))
        assert spell.index._tie_ordered(index, None, word, limit, load) == expected, word


def test_undouble_skips_only_words_no_known_word_undoubles_from(repair):
    """_may_undouble (one set lookup) is false only where none of _undoubled's spellings is known: checked on typos
    with a letter doubled or tripled in dictionary words (and a vocabulary word), the words themselves and random
    typos of them."""
    vocabulary = SpellRepair(extra_vocabulary=["zorbbix zorbbix"] * 2)
    rng = random.Random(3)
    words = rng.sample(sorted(w for w in spell.dictionary._counts() if w.isalpha() and len(w) >= 3), 3000) + ["zorbbix"]
    typos = [w[:i] + w[i] * rng.choice((1, 2)) + w[i:] for w in words for i in [rng.randrange(len(w))]]
    checked = [t for t in typos + words + sorted(_typos(words, 3000, seed=4)) if spell.repair._DOUBLE.search(t)]
    skipped = 0
    for word in checked:
        for r in (repair, vocabulary):
            found = any(r._known(v) for v in spell.dictionary._undoubled(word))
            assert r._may_undouble(word) or not found, word
            skipped += not r._may_undouble(word)
    assert len(checked) > 2000 and skipped > 100
    assert vocabulary._may_undouble("zorrbbix") and not repair._may_undouble("zorrbbix")


def test_a_repair_does_not_load_symspellpys_index_of_the_whole_dictionary():
    """Repairs at edit distance 1 and 2, with and without a vocabulary, search with _DeleteIndex and order ties by
    _tie_ordered: symspellpy's index of the shipped dictionary (2 s, 135 MB) never loads; distance 3 still needs it.
    In a fresh process: this one's tests load it as their reference."""
    code = """if True:
        from ttt_pipeline.corruption import corrupt_texts
        from ttt_pipeline.corruption.samples import synthetic_reviews
        from ttt_pipeline.defenses import spell
        texts = synthetic_reviews(60, seed=2)
        typos = corrupt_texts(texts, "tutorial", 4, 1).texts + corrupt_texts(texts, "keyboard", 4, 1).texts
        for distance, vocabulary in ((1, None), (2, None), (2, texts)):
            assert spell.SpellRepair(distance, vocabulary).repair_all(typos) != typos
        print(spell.dictionary._base.cache_info().currsize, end=" ")
        spell.SpellRepair(3).repair_all(typos[:5])
        print(spell.dictionary._base.cache_info().currsize)
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["0", "1"]


def test_counts_are_the_dictionary_symspellpy_loads():
    """_counts reads the shipped dictionary as symspellpy's load_dictionary does: same words, counts and order."""
    counts, loaded = spell.dictionary._counts(), spell.dictionary._base(2).words
    assert counts == loaded and list(counts) == list(loaded) and len(counts) > 80_000


def test_level_finds_exactly_the_entries_under_each_hash():
    """_Level's buckets (top bits of the mixed key) return every indexed entry whose hash equals a query's and no
    other, for spellings of every length: one letter (the smallest keys), words sharing deletes, absent ones."""
    words = ["a", "ab", "ba", "abc", "cab", "the", "tea", "eat", "battery", "batteries", "zzz"]
    hashes, owners, first, second = spell.index._delete_hashes(words, (0, 1, 2))
    level = spell.index._Level(hashes, owners, first, second)
    queries = ["a", "b", "ab", "tae", "batery", "q", "zz", "xyzw"]
    q_hashes, q_owners, q_first, q_second = spell.index._delete_hashes(queries, (0, 1))
    got = level.pairs(q_hashes, q_owners, q_first, q_second)
    expected = sorted((int(o), int(r), int(f), int(s), int(wf), int(ws))
                      for h, o, f, s in zip(q_hashes, q_owners, q_first, q_second)
                      for hh, r, wf, ws in zip(hashes, owners, first, second) if hh == h)
    assert sorted(zip(*(column.tolist() for column in got))) == expected
    assert len(expected) > 20 and {o for o, *_ in expected} >= {0, 1, 2, 3, 4}
    empty = spell.index._Level(*(column[:0] for column in (hashes, owners, first, second)))
    assert all(len(column) == 0 for column in empty.pairs(q_hashes, q_owners, q_first, q_second))


def test_real_word_rewrites_are_the_rule_on_every_dictionary_word():
    """_real_words (found once per dictionary) is the rule itself: a word rarer than 10^7 -> the anagram 1,000x
    as frequent; frequent words and words without one are absent."""
    table, counts = spell.dictionary._real_words(), spell.dictionary._counts()
    assert table["rae"] == "are" and "are" not in table and "the" not in table
    for word, other in table.items():
        assert counts[word] < spell.dictionary.REAL_WORD_MAX_COUNT and counts[other] >= spell.dictionary.REAL_WORD_RATIO * counts[word]
        assert sorted(word) == sorted(other) and word != other
    assert SpellRepair(fixes=("real_word",)).repair("rae you there") == "are you there"
    assert SpellRepair(fixes=("case",)).repair("rae you there") == "rae you there"


def test_one_text_at_a_time_is_the_batch():
    """repair_all resolves a batch's new words together (one search for all); text by text gives the same."""
    texts = _sample()
    one = SpellRepair()
    assert [one.repair(t) for t in texts] == SpellRepair().repair_all(texts)


def test_the_caches_hold_nothing_the_garbage_collector_must_walk():
    """Tuples of strings and numbers drop out of Python's cyclic collector; one holding a dict never does. The
    word caches once kept tens of thousands of tuples with a bigram dict in each per 400 reviews, so a full
    collection (0.6 s: it walks the dictionary too) came every few repairs; now every cached value is untracked."""
    import gc

    fresh = SpellRepair()
    texts = corrupt_texts(synthetic_reviews(80, seed=5), "keyboard", 4, 1).texts
    fresh.repair_all(texts)
    assert any(isinstance(v, tuple) for v in fresh._cache.values())  # tied candidates, ranked by their neighbours
    gc.collect()
    gc.collect()  # a tuple of tuples drops out once the inner ones have
    caches = (fresh._cache, fresh._tokens, fresh._stats, fresh._ranks)
    tracked = [v for cache in caches for v in cache.values() if gc.is_tracked(v)]
    assert tracked == [] and len(fresh._stats) > 0
