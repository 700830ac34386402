"""Label-free text descriptors: exact shares on hand-made reviews, odd input, and windows from sums."""

from __future__ import annotations

import time

import numpy as np
import pytest

from ttt_pipeline.evaluation.descriptors import (
    EVIDENTLY_NAMES,
    PER_TEXT,
    script,
    text_descriptors,
    training_scripts,
    window_descriptors,
    window_from_sums,
)

VOCABULARY = {"the": 5, "film": 3, "was": 3, "10": 2, "a": 4, "lot": 2}
ENGLISH = ["The film was good, a lot of fun.", "Ten out of 10 for the cast."]


def _one(text: str, repaired: str | None = None, **kw) -> dict[str, float]:
    out = text_descriptors([text], None if repaired is None else [repaired], VOCABULARY, {"LATIN"}, **kw)
    return {k: float(v[0]) for k, v in out.items()}


def test_hand_made_review_has_exact_shares():
    d = _one("The film was gud, 10/10!", "The film was good, 10/10!")
    # words: the film was gud 10 10; non-whitespace: 20 characters, 13 of them letters
    assert d == {"text_length": 24, "word_count": 6, "oov_words_share": 1 / 6, "repaired_words_share": 1 / 6,
                 "non_letter_character_share": 7 / 20, "foreign_script_share": 0.0}


def test_second_dictionary_counts_as_known_and_no_repair_means_no_repaired_share():
    d = _one("the film was gud", dictionary={"gud"})
    assert d["oov_words_share"] == 0.0
    assert "repaired_words_share" not in d and set(d) == set(PER_TEXT) - {"repaired_words_share"}


def test_empty_text_has_zero_shares():
    assert _one("", "") == dict.fromkeys(PER_TEXT, 0.0)
    assert _one("   \n", "   \n")["non_letter_character_share"] == 0.0


def test_repairs_that_merge_or_split_words_count_the_raw_words_they_lose():
    assert _one("I have alot of it", "I have a lot of it")["repaired_words_share"] == 1 / 5
    assert _one("the bat tery died", "the battery died")["repaired_words_share"] == 2 / 4
    assert _one("teh film teh end", "the film the end")["repaired_words_share"] == 2 / 4  # aligned: in place


def test_other_scripts_are_foreign_against_english_training_text():
    scripts = training_scripts(ENGLISH)
    assert scripts == {"LATIN"}
    d = text_descriptors(["Отличный фильм", "とても良い映画でした", "Great film, отличный", "Café ｆｉｌｍ"], None,
                         VOCABULARY, scripts)
    assert d["foreign_script_share"].tolist() == [1.0, 1.0, 8 / 17, 0.0]  # fullwidth Latin is Latin
    assert script("я") == "CYRILLIC" and script("と") == "HIRAGANA" and script("映") == "CJK"


def test_a_script_with_a_tiny_share_of_the_training_letters_is_not_a_training_script():
    texts = ["a" * 995 + " αβγδε"]  # 5 Greek letters in 1000
    assert training_scripts(texts) == {"LATIN"}
    assert training_scripts(texts, min_share=0.001) == {"LATIN", "GREEK"}


def test_nul_bytes_and_lone_surrogates_are_counted_not_fatal():
    d = _one("a\x00b \ud800 c²", "a\x00b \ud800 c²")
    # words a, b, c²; visible: a NUL b SURROGATE c ² = 6 characters, 3 letters (² is no letter)
    assert d["word_count"] == 3 and d["non_letter_character_share"] == 3 / 6 and d["foreign_script_share"] == 0.0


def test_megabyte_review_takes_linear_time():
    text = "the film was gud, 10/10! " * 42000  # about 1 MB
    t0 = time.perf_counter()
    d = _one(text, text.replace("gud", "good"))
    assert time.perf_counter() - t0 < 5.0
    assert d["oov_words_share"] == pytest.approx(1 / 6) and d["repaired_words_share"] == pytest.approx(1 / 6)


def test_missing_text_is_an_error_not_a_zero():
    with pytest.raises(TypeError, match="text 1 is NoneType"):
        text_descriptors(["fine", None], None, VOCABULARY, {"LATIN"})
    with pytest.raises(ValueError, match="1 repaired texts for 2"):
        text_descriptors(["a", "b"], ["a"], VOCABULARY, {"LATIN"})


def test_evidently_names_cover_shared_measures_only():
    assert set(EVIDENTLY_NAMES) <= set(PER_TEXT)
    assert EVIDENTLY_NAMES["oov_words_share"] == "OOVWordsPercentage"


def _window_inputs():
    texts = ["The film was gud", "Отличный фильм", "", "a lot of fun 10/10", "teh end"]
    repaired = ["The film was good", "Отличный фильм", "", "a lot of fun 10/10", "the end"]
    per_text = text_descriptors(texts, repaired, VOCABULARY, {"LATIN"})
    probs = np.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8], [0.55, 0.45]])
    return per_text, probs, np.array([0, 1, 1, 1, 1]), np.array([0, 1, 0, 1, 0])


def test_window_means_confidence_changes_and_label_shift():
    per_text, probs, raw, fixed = _window_inputs()
    w = window_descriptors(per_text, probs, raw, fixed, reference_label_shares=[0.5, 0.5], threshold=0.65)
    assert w["n"] == 5
    assert w["repaired_words_share"] == pytest.approx((1 / 4 + 1 / 2) / 5)
    assert w["mean_confidence"] == pytest.approx((0.9 + 0.7 + 0.6 + 0.8 + 0.55) / 5)
    assert w["defense_change_rate"] == pytest.approx(2 / 5)
    assert w["label_shares"] == [0.6, 0.4] and w["label_share_shift"] == pytest.approx(0.1)
    assert w["threshold"] == 0.65 and w["share_above_threshold"] == pytest.approx(3 / 5)
    plain = window_descriptors(per_text, probs)
    assert plain["defense_change_rate"] is None and plain["label_share_shift"] is None
    assert "share_above_threshold" not in plain


def test_window_from_a_databases_sums_equals_the_window_from_arrays():
    duckdb = pytest.importorskip("duckdb")
    per_text, probs, raw, fixed = _window_inputs()
    arrays = window_descriptors(per_text, probs, raw, fixed, reference_label_shares=[0.5, 0.5], threshold=0.65)
    table = {**per_text, "confidence": probs.max(1), "pred": probs.argmax(1), "raw": raw, "fixed": fixed}
    con = duckdb.connect()
    con.register("reviews", {k: np.asarray(v) for k, v in table.items()})
    cols = ", ".join(f"sum({k})" for k in per_text)
    row = con.execute(f"select count(*), {cols}, sum(confidence), count(*) filter (where raw <> fixed), "
                      "count(*) filter (where confidence > 0.65), count(*) filter (where pred = 0), "
                      "count(*) filter (where pred = 1) from reviews").fetchone()
    n, *rest = row
    sums = dict(zip(per_text, rest))
    sums.update(confidence=rest[len(per_text)], changed_predictions=rest[len(per_text) + 1], threshold=0.65,
                above_threshold=rest[len(per_text) + 2], label_counts=rest[len(per_text) + 3:])
    streamed = window_from_sums(sums, n, reference_label_shares=[0.5, 0.5])
    assert streamed.keys() == arrays.keys()
    for key, value in arrays.items():
        assert streamed[key] == pytest.approx(value, abs=1e-12), key


def test_empty_window_has_no_means_and_half_given_predictions_are_refused():
    per_text = text_descriptors([], [], VOCABULARY, {"LATIN"})
    w = window_descriptors(per_text, np.zeros((0, 2)))
    assert w["n"] == 0 and w["mean_confidence"] is None and w["oov_words_share"] is None
    assert w["label_shares"] is None
    per_text, probs, raw, _ = _window_inputs()
    with pytest.raises(ValueError, match="both preds_raw and preds_repaired"):
        window_descriptors(per_text, probs, preds_raw=raw)


def test_spell_repair_changes_more_words_as_misspellings_grow():
    from ttt_pipeline.corruption import corrupt_texts
    from ttt_pipeline.defenses.spell import SpellRepair
    from ttt_pipeline.defenses.vocabulary import training_vocabulary

    texts = ["I received the package and I definitely believe it works because the battery lasts",
             "the seller was not responsible and the receipt was separate from the occasional refund",
             "it is definitely the best purchase I made, although the accessories arrived separately"] * 3
    vocabulary = training_vocabulary(texts)
    repair = SpellRepair(extra_vocabulary=vocabulary)
    shares = []
    for severity in (1, 5):
        noisy = corrupt_texts(texts, "misspelling", severity, seed=0).texts
        d = text_descriptors(noisy, repair.repair_all(noisy), vocabulary, {"LATIN"})
        shares.append(float(d["repaired_words_share"].mean()))
    clean = text_descriptors(texts, repair.repair_all(texts), vocabulary, {"LATIN"})
    assert float(clean["repaired_words_share"].mean()) == 0.0
    assert 0.0 < shares[0] < shares[1]
