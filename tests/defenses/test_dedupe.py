"""The `dedupe` repair: what it repairs, what it leaves alone, and that its name works everywhere a defense's does."""

from ttt_pipeline.config import load_config
from ttt_pipeline.corruption import corrupt_texts
from ttt_pipeline.defenses import registry
from ttt_pipeline.defenses.dedupe import dedupe

TEXTS = ["The battery lasts all day and the sound is clear.", "Stopped working after a week, very disappointed.",
         "Great value for the price; I would buy it again."]


def test_a_word_written_twice_keeps_its_first_copy():
    assert dedupe("the the battery") == "the battery"
    assert dedupe("The the battery, battery lasts") == "The battery, battery lasts"  # punctuation separates
    assert dedupe("it it it works") == "it works"
    assert dedupe("then the theme") == "then the theme"  # whole words only
    assert dedupe("") == ""


def test_it_undoes_the_word_repeat_corruption():
    corrupted = corrupt_texts(TEXTS, "word_repeat", 3, seed=42).texts
    assert list(corrupted) != TEXTS
    assert [dedupe(t) for t in corrupted] == TEXTS


def test_the_name_resolves_alone_and_in_compositions():
    assert registry.parse("dedupe").repairs == ("dedupe",) and registry.parse("dedupe").engine == "none"
    method = registry.parse("dedupe+spell+masked_ttt")
    assert method.repairs == ("dedupe", "spell") and method.engine == "masked_ttt" and method.masked
    (repair,) = registry.build_repairs("dedupe", settings=None)
    assert repair(["good good phone"]) == ["good phone"]
    cfg = load_config("demo", ["ttt.methods=[none, dedupe, dedupe+masked_ttt]", "evaluation.default_defense=dedupe"])
    assert cfg.ttt.methods == ["none", "dedupe", "dedupe+masked_ttt"]


def test_the_evaluate_steps_scoring_runs_it_in_front_of_the_model(tiny_clf):
    """`dedupe` scores the repaired texts: its logits on a corrupted review are the plain model's on the
    review it repaired to."""
    from ttt_pipeline.defenses.base import TTTSettings
    from ttt_pipeline.evaluation.scoring import predict_texts

    model, tok = tiny_clf
    corrupted = list(corrupt_texts(TEXTS, "word_repeat", 3, seed=42).texts)
    repaired = predict_texts(model, tok, corrupted, "dedupe", TTTSettings(), 48, 4)
    plain = predict_texts(model, tok, TEXTS, "none", TTTSettings(), 48, 4)
    assert repaired.shape == (3, 3)
    assert (abs(repaired - plain) < 1e-5).all()
