"""The `dedupe` repair: what it repairs, what it leaves alone, and that its name works everywhere a defense's does."""

import pytest

from ttt_pipeline.config import load_config
from ttt_pipeline.corruption import corrupt_texts
from ttt_pipeline.defenses import registry
from ttt_pipeline.defenses.dedupe import dedupe
from ttt_pipeline.errors import ConfigError

TEXTS = ["The battery lasts all day and the sound is clear.", "Stopped working after a week, very disappointed.",
         "Great value for the price; I would buy it again."]


def test_a_word_written_twice_keeps_its_first_copy():
    assert dedupe("the the battery") == "the battery"
    assert dedupe("The the battery, battery lasts") == "The battery, battery lasts"  # punctuation separates
    assert dedupe("it it it works") == "it works"
    assert dedupe("then the theme") == "then the theme"  # whole words only
    assert dedupe("") == ""
    assert dedupe("The the battery", ignore_case=False) == "The the battery"  # the knob: copies spelled alike only


def test_its_knob_is_a_config_key_and_a_request_setting():
    """`ttt.dedupe.ignore_case`: collected from the module's Settings, validated, and read by its build."""
    cfg = load_config("demo", ["ttt.dedupe.ignore_case=false"])
    (repair,) = registry.build_repairs("dedupe", cfg.ttt)
    assert repair(["The the phone", "good good"]) == ["The the phone", "good"]
    (default,) = registry.build_repairs("dedupe", load_config("demo").ttt)
    assert default(["The the phone"]) == ["The phone"]
    with pytest.raises(ConfigError, match="ttt.dedupe.ignore_case"):
        load_config("demo", ["ttt.dedupe.ignore_case=maybe"])


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
    from ttt_pipeline.defenses.base import EngineSettings
    from ttt_pipeline.evaluation.scoring import predict_texts

    model, tok = tiny_clf
    corrupted = list(corrupt_texts(TEXTS, "word_repeat", 3, seed=42).texts)
    repaired = predict_texts(model, tok, corrupted, "dedupe", EngineSettings(), 48, 4)
    plain = predict_texts(model, tok, TEXTS, "none", EngineSettings(), 48, 4)
    assert repaired.shape == (3, 3)
    assert (abs(repaired - plain) < 1e-5).all()


def test_the_architecture_docs_show_this_module_as_it_is():
    """docs/architecture.md's worked example ("a defense is one file") is the module's code, not a paraphrase."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    doc = (repo / "docs" / "architecture.md").read_text()
    block = doc.split("`ttt_pipeline/defenses/dedupe.py`:\n\n```python\n", 1)[1].split("```", 1)[0]
    assert block.strip() and block.strip() in (repo / "ttt_pipeline" / "defenses" / "dedupe.py").read_text()
