"""`ttt.spell.ranking`: equally close candidates chosen by frequency, by bigrams between the neighbours, or by context
(bigrams, in-domain pairs, look-alike shapes) behind a gate that leaves a word alone when no candidate is clearly
best; the settings validated."""

from __future__ import annotations

import math

import pytest

from ttt_pipeline.config import load_config
from ttt_pipeline.defenses import registry
from ttt_pipeline.defenses.spell import Settings, SpellRepair, build
from ttt_pipeline.defenses.spell.ranking import LOOKALIKE_BONUS, lookalike_spellings
from ttt_pipeline.defenses.spell.repair import domain_bigrams
from ttt_pipeline.errors import ConfigError


@pytest.fixture(scope="module")
def frequency() -> SpellRepair:
    return SpellRepair(ranking="frequency")


@pytest.fixture(scope="module")
def context() -> SpellRepair:
    return SpellRepair(ranking="context")


def _scores(repair: SpellRepair, before, after, written: str) -> list[tuple[float, str]]:
    repair.repair(written)  # caches the word's candidates
    return [(round(score, 2), term) for score, _, term in
            repair._ranker.scores(repair._cache[written], before, after, written)]


def test_form_or_from_is_chosen_by_the_neighbours(frequency, context):
    """`frm` is one edit from `from`, `form`, `firm` and `farm`: frequency always takes `from`; the neighbours
    take `form` after `the` and before `of` (log score 20.23 against firm's 16.71) and `from` in `away frm home`
    (16.12 against form's 7.20)."""
    assert frequency.repair("the frm of the film") == "the from of the film"
    assert context.repair("the frm of the film") == "the form of the film"
    assert context.repair("away frm home") == "away from home"
    assert _scores(context, "the", "of", "frm")[:2] == [(20.23, "form"), (16.71, "firm")]
    assert _scores(context, "away", "home", "frm")[:2] == [(16.12, "from"), (7.2, "form")]


def test_a_look_alike_shape_is_preferred(frequency, context):
    """`rnore`: `snore` is its closest word (1 edit) and frequency takes it; `rn` read as `m` gives `more` (2 edits),
    which joins the candidates with LOOKALIKE_BONUS (log 100) and wins: 19.38 against 3.03."""
    assert "more" in lookalike_spellings("rnore") and "modern" in lookalike_spellings("rnodem")
    assert frequency.repair("one rnore time") == "one snore time"
    assert context.repair("one rnore time") == "one more time"
    assert context.repair("vvhat a film") == "what a film"
    assert LOOKALIKE_BONUS == pytest.approx(math.log(100))
    assert _scores(context, "one", "time", "rnore") == [(19.38, "more"), (3.03, "snore")]


def test_the_gate_leaves_a_word_alone_without_a_clear_winner():
    """`fill in the frm` (after `the`, nothing after): form scores 21.19, firm 19.53, a margin of 1.66; `the frm
    of` has a margin of 3.52."""
    assert _scores(SpellRepair(ranking="context"), "the", None, "frm")[:2] == [(21.19, "form"), (19.53, "firm")]
    assert SpellRepair(ranking="context", gate=1.6).repair("fill in the frm") == "fill in the form"
    assert SpellRepair(ranking="context", gate=1.7).repair("fill in the frm") == "fill in the frm"
    assert SpellRepair(ranking="context", gate=3.5).repair("the frm of it") == "the form of it"
    assert SpellRepair(ranking="context", gate=3.6).repair("the frm of it") == "the frm of it"
    gated = SpellRepair(ranking="context", gate=50)
    assert gated.repair("definately probbly") == "definitely probably"  # one candidate each: nothing to gate
    assert gated.repair("Untill FRM") == "Until FRM"  # an acronym is never a candidate


def test_in_domain_bigrams_count_when_given_domain_texts():
    """Pairs across whitespace only, lower-cased; with them, a pair the domain writes often wins."""
    follows, total = domain_bigrams(["Fill in the farm, the farm.", "farm  ledger"])
    assert follows == {"fill": {"in": 1}, "in": {"the": 1}, "the": {"farm": 2}, "farm": {"ledger": 1}} and total == 5
    domain = ["we fill in the farm ledger each week"] * 20
    assert SpellRepair(ranking="context").repair("fill in the frm") == "fill in the form"
    assert SpellRepair(ranking="context", domain_texts=domain).repair("fill in the frm") == "fill in the farm"


def test_the_default_ranking_is_the_bigram_one_as_before():
    default = SpellRepair()
    assert default.ranking == "bigram" and "context" in default.fixes
    assert SpellRepair(fixes=[]).ranking == "frequency"
    assert "context" not in SpellRepair(ranking="frequency").fixes
    assert Settings().ranking == "bigram" and Settings().gate == 0.0
    repair = build(Settings(ranking="context", gate=1.7), {"vocabulary": {"frm": 1}})
    assert repair(["fill in the frm"]) == ["fill in the frm"]


def test_bad_rankings_and_gates_are_refused():
    with pytest.raises(ValueError, match="unknown spell ranking 'best'"):
        SpellRepair(ranking="best")
    with pytest.raises(ValueError, match="needs ranking 'context'"):
        SpellRepair(gate=1.0)
    with pytest.raises(ValueError, match="needs ranking 'context'"):
        SpellRepair(ranking="context", gate=-1.0)


def test_the_config_names_the_field():
    cfg = load_config("demo", ["ttt.spell.ranking=context", "ttt.spell.gate=2"])
    assert (cfg.ttt.spell.ranking, cfg.ttt.spell.gate) == ("context", 2.0)
    assert registry.own_settings("spell", cfg.ttt).gate == 2.0
    with pytest.raises(ConfigError, match=r"'ttt.spell.gate': .*needs ttt.spell.ranking=context") as err:
        load_config("demo", ["ttt.spell.gate=2"])
    assert err.value.hint
    with pytest.raises(ConfigError, match=r"'ttt.spell.ranking'"):
        load_config("demo", ["ttt.spell.ranking=best"])
    with pytest.raises(ConfigError, match=r"'ttt.spell.gate'"):
        load_config("demo", ["ttt.spell.ranking=context", "ttt.spell.gate=-1"])
