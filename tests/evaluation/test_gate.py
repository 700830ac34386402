"""The CI gate (evaluation/gate.py, `run` / `evaluate --fail-if`): rules parsed at the edge, read against the
run's MLflow figures, `pt` as percentage points, `default` as the recommended defense, the job summary."""

from __future__ import annotations

import pytest

from ttt_pipeline.errors import ConfigError
from ttt_pipeline.evaluation.gate import check, markdown, parse_rule, run_figures


def _diff(delta, lo, hi):
    return {"delta": delta, "ci_low": lo, "ci_high": hi, "p_mcnemar": 0.01, "helped": 3, "hurt": 1,
            "significant": lo > 0 or hi < 0, "n": 129}


SUMMARY = {
    "acc_clean": 0.9, "acc_corrupted": 0.75, "acc_default": 0.85, "corruption_drop": _diff(0.15, 0.09, 0.21),
    "defense_gain": {**_diff(0.1, 0.05, 0.15), "method": "spell"},
    "gains": {"spell": {"corrupted": _diff(0.1, 0.05, 0.15), "clean": _diff(-0.01, -0.03, 0.01)}},
    "worst_case": {"spell": {**_diff(-0.02, -0.05, -0.005), "set": "shift_kitchen", "n_sets": 4,
                             "harmed_sets": ["shift_kitchen"], "harm": True}},
    "mlflow_run_id": "abc123", "default_defense": "spell",
}


def _outcomes(*texts: str):
    return check([parse_rule(t) for t in texts], run_figures(SUMMARY), "spell")


def test_rules_read_the_runs_figures_in_their_units_or_in_points():
    drop, points, below, acc = _outcomes("drop.ci_low > 3pt", "drop.ci_low > 10pt", "corruption_drop_ci_low<0.1",
                                         "acc_clean >= 0.9")
    assert (drop.metric, drop.value, drop.held) == ("corruption_drop_ci_low", 0.09, True)  # 9 points > 3
    assert not points.held and below.held and acc.held


def test_default_names_the_recommended_defense_and_a_bare_flag_holds_when_set():
    harm, worst, gain = _outcomes("harm/default", "worst/default.ci_high < -1pt", "gain/default/clean.ci_low < 0")
    assert (harm.metric, harm.held) == ("harm/spell", True)
    assert (worst.metric, worst.value, worst.held) == ("worst/spell_ci_high", -0.005, False)
    assert (gain.metric, gain.value, gain.held) == ("gain/spell/clean_ci_low", -0.03, True)
    [significant] = _outcomes("gain.significant")
    assert significant.metric == "defense_gain_significant" and significant.held


@pytest.mark.parametrize("text, words", [
    ("drop >", "is not FIGURE OP NUMBER"), ("drop => 3", "is not FIGURE OP NUMBER"), ("", "is not FIGURE"),
    ("accuracy > 0.5", "'accuracy' is not a figure a run reports"), ("drop > 3 points", "is not FIGURE"),
])
def test_a_malformed_rule_or_an_unknown_figure_fails_at_the_edge(text, words):
    with pytest.raises(ConfigError, match=words) as err:
        parse_rule(text)
    assert "'drop.ci_low > 3pt'" in err.value.hint


def test_a_figure_this_run_lacks_lists_the_ones_it_has():
    with pytest.raises(ConfigError, match="no figure 'gain/tent/corrupted'") as err:
        _outcomes("gain/tent/corrupted < 0")
    assert "gain/spell/corrupted" in err.value.hint and "acc_clean" in err.value.hint


def test_the_job_summary_says_the_verdict_each_rules_value_and_the_headline():
    text = markdown(_outcomes("drop.ci_low > 3pt", "acc_clean < 0.5"), SUMMARY)
    assert text.startswith("## ttt-pipeline gate: failed: 1 of 2 rules hold\n")
    assert "| `drop.ci_low > 3pt` | `corruption_drop_ci_low` | 0.09 | **yes** |" in text
    assert "| `acc_clean < 0.5` | `acc_clean` | 0.9 | no |" in text
    assert "drop under noise: +15.00 [+9.00, +21.00] points" in text and "`spell` wins back: +10.00" in text
    assert "MLflow run `abc123`" in text
    assert markdown(_outcomes("acc_clean < 0.5"), SUMMARY).startswith("## ttt-pipeline gate: passed")
