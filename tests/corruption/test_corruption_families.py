"""Registry, exact severity rates and per-family semantics of the corruption suite."""

from __future__ import annotations

import dataclasses
import random
import re
import string
import unicodedata
from pathlib import Path

import pytest

from ttt_pipeline.corruption import (
    FAMILIES,
    SEVERITY_RATES,
    CorruptedSet,
    Family,
    corrupt_texts,
    get_family,
    list_families,
    tutorial_corrupt,
)
from ttt_pipeline.corruption.characters import KEYBOARD_NEIGHBOURS
from ttt_pipeline.corruption.samples import synthetic_reviews

REQUIRED = ["char_swap", "char_drop", "char_repeat", "word_delete", "word_shuffle", "keyboard",
            "char_insert", "ocr", "case", "word_repeat", "word_swap", "punctuation", "tutorial"]
EXACT = [f for f in REQUIRED if f != "tutorial"]
SEVERITIES = [1, 2, 3, 4, 5]

# >= 50 words each: the regime where the issue promises +-20% of the target rate
LONG = synthetic_reviews(150, seed=7, min_words=50, max_words=120)


def test_registry_names_order_and_shape():
    assert SEVERITY_RATES == {1: 0.02, 2: 0.05, 3: 0.10, 4: 0.20, 5: 0.30}
    assert len(FAMILIES) >= 10
    assert list_families() == list(FAMILIES)
    assert set(REQUIRED) <= set(FAMILIES)
    for name, fam in FAMILIES.items():
        assert isinstance(fam, Family) and fam.name == name
        assert fam.unit in ("char", "word")
        assert fam.description and "\n" not in fam.description and "\t" not in fam.description
        assert callable(fam.apply)
    assert get_family("ocr") is FAMILIES["ocr"]


def test_unknown_family_names_the_valid_ones():
    with pytest.raises(ValueError) as exc:
        get_family("typo")
    for name in REQUIRED:
        assert name in str(exc.value)
    with pytest.raises(ValueError):
        corrupt_texts(["x"], "typo", 1, 0)


@pytest.mark.parametrize("bad", [0, 6, -1, 2.0, "3", True, None])
def test_bad_severity_rejected(bad):
    with pytest.raises((ValueError, TypeError)):
        corrupt_texts(["hello world"], "char_drop", bad, 0)


def test_bad_texts_rejected():
    with pytest.raises(TypeError):
        corrupt_texts("a single string", "char_drop", 1, 0)
    with pytest.raises(TypeError):
        corrupt_texts(["ok", 3], "char_drop", 1, 0)
    with pytest.raises(ValueError):
        tutorial_corrupt(["x"], char_prob=1.5)


@pytest.mark.parametrize("family", EXACT)
def test_realised_rate_within_20pct_of_target(family):
    for sev in SEVERITIES:
        cs = corrupt_texts(LONG, family, sev, seed=11)
        target = SEVERITY_RATES[sev]
        assert cs.n_eligible > 0
        assert cs.realised_edit_rate == pytest.approx(cs.n_edits / cs.n_eligible)
        assert abs(cs.realised_edit_rate / target - 1) <= 0.20, (family, sev, cs.realised_edit_rate)
        # and in practice it is much tighter than the promise
        assert abs(cs.realised_edit_rate / target - 1) <= 0.10, (family, sev, cs.realised_edit_rate)


@pytest.mark.parametrize("family", EXACT)
def test_each_text_is_within_one_edit_of_its_exact_count(family):
    fam = FAMILIES[family]
    for sev in (1, 3, 5):
        rate = SEVERITY_RATES[sev]
        for i, text in enumerate(LONG[:40]):
            new, n_edits, n_eligible = fam.apply(text, rate, random.Random(i))
            assert abs(n_edits - rate * n_eligible) < 1.0 + 1e-9, (family, sev, n_edits, n_eligible)
            if n_edits:
                assert new != text


def test_rate_scales_with_severity_and_tutorial_ignores_it():
    for family in EXACT:
        rates = [corrupt_texts(LONG[:30], family, s, 0).realised_edit_rate for s in SEVERITIES]
        assert rates == sorted(rates) and rates[0] < rates[-1]
    tut = [corrupt_texts(LONG[:30], "tutorial", s, 0) for s in SEVERITIES]
    assert all(t.texts == tut[0].texts for t in tut)
    assert [t.severity for t in tut] == SEVERITIES
    assert tutorial_corrupt(LONG[:30], 0.1, 0.1, seed=0).texts == tut[0].texts


def test_tutorial_rate_is_fraction_of_words_changed():
    cs = corrupt_texts(LONG, "tutorial", 3, seed=5)
    assert cs.n_eligible == sum(len(t.split()) for t in LONG)
    # char prob 0.1 on ~5-letter words + word prob 0.1: roughly 35-50% of words touched
    assert 0.25 < cs.realised_edit_rate < 0.6
    none = tutorial_corrupt(LONG[:5], char_prob=0.0, word_prob=0.0, seed=5)
    assert none.n_edits == 0 and none.realised_edit_rate == 0.0
    assert none.texts == [" ".join(t.split()) for t in LONG[:5]]


@pytest.mark.parametrize("family", REQUIRED)
def test_count_order_and_alignment_preserved(family):
    texts = ["", "short one", LONG[0], "", LONG[1], LONG[0]]
    cs = corrupt_texts(texts, family, 5, seed=3)
    assert len(cs.texts) == len(texts) == len(cs)
    assert cs.texts[0] == "" and cs.texts[3] == ""
    # identical inputs get identical outputs: a text's fate never depends on its position
    assert cs.texts[2] == cs.texts[5]
    alone = corrupt_texts([LONG[1]], family, 5, seed=3).texts[0]
    assert cs.texts[4] == alone


def test_corrupted_set_record_and_digest():
    cs = corrupt_texts(LONG[:10], "keyboard", 2, seed=9)
    assert isinstance(cs, CorruptedSet)
    assert (cs.family, cs.severity, cs.seed) == ("keyboard", 2, 9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cs.seed = 1  # type: ignore[misc]
    d = cs.digest()
    assert len(d) == 64 and all(c in "0123456789abcdef" for c in d)
    assert d == corrupt_texts(LONG[:10], "keyboard", 2, seed=9).digest()
    others = {corrupt_texts(LONG[:10], "keyboard", 3, seed=9).digest(),
              corrupt_texts(LONG[:10], "keyboard", 2, seed=8).digest(),
              corrupt_texts(LONG[:10], "ocr", 2, seed=9).digest(),
              corrupt_texts(LONG[:9], "keyboard", 2, seed=9).digest()}
    assert d not in others and len(others) == 4
    # the digest covers family/severity/seed even when the texts are identical
    assert corrupt_texts([""], "case", 1, 0).digest() != corrupt_texts([""], "case", 2, 0).digest()
    empty = corrupt_texts([], "case", 1, 0)
    assert empty.texts == [] and empty.n_eligible == 0 and empty.realised_edit_rate == 0.0


# ---- per-family semantics: each family does what its name says, and every edit is a change


def _apply(family, text, sev=5, seed=0):
    return FAMILIES[family].apply(text, SEVERITY_RATES[sev], random.Random(seed))


def test_char_drop_and_repeat_change_length_by_edit_count():
    for i, text in enumerate(LONG[:20]):
        new, e, n = _apply("char_drop", text, seed=i)
        assert len(new) == len(text) - e and n == sum(not c.isspace() for c in text)
        new, e, n = _apply("char_repeat", text, seed=i)
        assert len(new) == len(text) + e
        new, e, n = _apply("char_insert", text, seed=i)
        assert len(new) == len(text) + e


def test_char_swap_is_a_same_word_transposition():
    for i, text in enumerate(LONG[:20]):
        new, e, n = _apply("char_swap", text, seed=i)
        assert len(new) == len(text) and sorted(new) == sorted(text)
        assert new.split(" ").__len__() == text.split(" ").__len__()
        diffs = sum(a != b for a, b in zip(new, text))
        assert diffs == 2 * e  # non-overlapping swaps of different letters


def test_keyboard_uses_neighbours_and_case_only_flips_case():
    for i, text in enumerate(LONG[:20]):
        new, e, _ = _apply("keyboard", text, seed=i)
        changed = [(a, b) for a, b in zip(text, new) if a != b]
        assert len(new) == len(text) and len(changed) == e
        assert all(b in KEYBOARD_NEIGHBOURS[a] for a, b in changed)
        new, e, _ = _apply("case", text, seed=i)
        assert new.lower() == text.lower() and sum(a != b for a, b in zip(text, new)) == e


def test_ocr_confusions():
    new, e, n = _apply("ocr", "modern", sev=5, seed=0)
    assert new != "modern" and e >= 1
    seen = set()
    for seed in range(300):
        new, e, _ = FAMILIES["ocr"].apply("rn m cl vv l O", 0.3, random.Random(seed))
        seen.update(new.split())
    for expected in ["m", "rn", "d", "w", "1", "0"]:
        assert expected in seen, (expected, seen)


def test_word_shuffle_keeps_first_last_and_letters():
    for i, text in enumerate(LONG[:20]):
        new, e, n = _apply("word_shuffle", text, seed=i)
        old_w, new_w = text.split(" "), new.split(" ")
        assert len(old_w) == len(new_w)
        changed = [(a, b) for a, b in zip(old_w, new_w) if a != b]
        assert len(changed) == e  # every counted shuffle is visible
        for a, b in changed:
            core_a = a.strip(string.punctuation)
            assert len(core_a) >= 4 and a[0] == b[0] and a[-1] == b[-1] and sorted(a) == sorted(b)
    # words whose inner letters cannot change are not eligible, so nothing happens
    assert _apply("word_shuffle", "book feet cat a to") == ("book feet cat a to", 0, 0)


def test_word_delete_repeat_swap():
    for i, text in enumerate(LONG[:20]):
        n_words = len(text.split())
        new, e, n = _apply("word_delete", text, seed=i)
        assert n == n_words and len(new.split()) == n_words - e and "  " not in new
        new, e, n = _apply("word_repeat", text, seed=i)
        assert len(new.split()) == n_words + e
        new, e, n = _apply("word_swap", text, seed=i)
        assert sorted(new.split()) == sorted(text.split()) and new != text
        moved = sum(a != b for a, b in zip(new.split(), text.split()))
        assert moved == 2 * e
    # never deletes the last word; identical neighbours are not swappable
    assert _apply("word_delete", "alone", sev=5) == ("alone", 0, 1)
    for seed in range(20):
        out, e, _ = FAMILIES["word_delete"].apply("two words", 1.0, random.Random(seed))
        assert out in ("two", "words") and e == 1
    assert _apply("word_swap", "the the the") == ("the the the", 0, 0)


def test_punctuation_keeps_letters_and_digits():
    for i, text in enumerate(LONG[:20]):
        new, e, n = _apply("punctuation", text, seed=i)
        assert e > 0 and new != text
        assert [c for c in new if c.isalnum()] == [c for c in text if c.isalnum()]
    out, e, n = _apply("punctuation", "Hi, you. Ok", sev=5, seed=1)
    # slots: ',' and '.' (drop), the 2 spaces (double / remove), the final 'k' (insert after);
    # 'Hi,' and 'you.' already end in punctuation, so no mark is inserted after them
    assert n == 5 and e in (1, 2) and out != "Hi, you. Ok"  # 0.3 * 5 = 1.5 edits: 1 or 2


# ---- edge cases: nothing crashes, Unicode stays valid, clusters stay whole

EDGE = ["", "a", "I", " ", "   \t  ", "\n", "é", "e\u0301", "😀", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷🇩🇪",
        "日本語のテキストです", "naïve café résumé", "Ünïcödé wörds ärë fïnë", "a b", "ab", "!!!", "x\u200dy",
        "مرحبا بالعالم", "Привет, мир!", "tab\tseparated\twords", "e\u0301e\u0301e\u0301 cafe\u0301s"]


@pytest.mark.parametrize("family", REQUIRED)
def test_edge_texts_do_not_crash_and_stay_valid(family):
    for sev in SEVERITIES:
        cs = corrupt_texts(EDGE, family, sev, seed=sev)
        assert len(cs.texts) == len(EDGE)
        for src, out in zip(EDGE, cs.texts):
            assert isinstance(out, str)
            out.encode("utf-8")  # valid Unicode: no lone surrogates
            if src == "":
                assert out == ""
        assert 0 <= cs.n_edits <= cs.n_eligible


@pytest.mark.parametrize("family", EXACT)
def test_combining_marks_and_emoji_sequences_are_not_split(family):
    nfd = unicodedata.normalize("NFD", "Résumé naïve café élève déjà vu über Ökonomie") + " 👨\u200d👩\u200d👧 👍🏽 🇫🇷"
    texts = [nfd] * 1 + [nfd + f" {i}" for i in range(30)]
    for sev in (3, 5):
        for out in corrupt_texts(texts, family, sev, seed=1).texts:
            for k, ch in enumerate(out):
                if unicodedata.combining(ch) or ch in "\u200d\U0001F3FD":
                    assert k > 0 and not out[k - 1].isspace(), (family, out)
                if ch == "\u200d":
                    assert out[k + 1] in "👩👧", (family, out)
            # flags come in pairs
            ri = [ch for ch in out if 0x1F1E6 <= ord(ch) <= 0x1F1FF]
            assert len(ri) % 2 == 0


MDSD = Path(__file__).resolve().parents[3] / "shared" / "data" / "mdsd" / "electronics" / "positive.review"


@pytest.mark.skipif(not MDSD.is_file(), reason=f"real MDSD reviews not found at {MDSD}")
def test_realised_rate_on_real_reviews():
    raw = MDSD.read_text(encoding="utf-8", errors="replace")
    reviews = [" ".join(m.split()) for m in re.findall(r"<review_text>(.*?)</review_text>", raw, re.S)]
    long_reviews = [r for r in reviews if len(r.split()) >= 50][:200]
    assert len(long_reviews) >= 100
    for family in EXACT:
        for sev in SEVERITIES:
            cs = corrupt_texts(long_reviews, family, sev, seed=0)
            assert abs(cs.realised_edit_rate / SEVERITY_RATES[sev] - 1) <= 0.20, (family, sev)
