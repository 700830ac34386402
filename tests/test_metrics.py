"""The headline metrics: the recovered fraction is defined only where corruption lowered accuracy."""

import pytest

from ttt_pipeline.evaluation.scoring import headline
from ttt_pipeline.metrics import recovered_fraction


def test_recovered_fraction_of_a_real_drop():
    assert recovered_fraction(0.60, 0.50, 0.53) == pytest.approx(0.30)
    assert recovered_fraction(0.60, 0.50, 0.48) == pytest.approx(-0.20)  # TTT made it worse


@pytest.mark.parametrize("clean,corrupted", [(0.50, 0.50), (0.424, 0.434)])
def test_no_drop_no_fraction(clean, corrupted):
    # the demo's case: corrupted above clean, TTT +1 point; the ratio would read -1.0
    assert recovered_fraction(clean, corrupted, corrupted + 0.01) is None


def test_headline_leaves_the_undefined_fraction_out():
    rows = [{"kind": "clean", "method": "none", "acc": 0.424, "macro_f1": 0.3},
            {"kind": "corrupted", "method": "none", "acc": 0.434},
            {"kind": "corrupted", "method": "masked_ttt", "acc": 0.444}]
    out = headline(rows, "masked_ttt")
    assert "recovered_fraction" not in out
    assert out["acc_ttt"] == pytest.approx(0.444)
    rows[1]["acc"] = 0.324
    assert headline(rows, "masked_ttt")["recovered_fraction"] == pytest.approx(0.12 / 0.1)


def test_the_headline_follows_the_recommended_defense_not_masked_ttt():
    """Issue 38: acc_default is the corrupted accuracy under evaluation.default_defense (the registry's metric
    resolves to acc_corrupted_<defense>); the recovered fraction is the default defense's; masked TTT stays."""
    rows = [{"kind": "clean", "method": "none", "acc": 0.80, "macro_f1": 0.8},
            {"kind": "clean", "method": "spell", "acc": 0.81, "macro_f1": 0.8},
            {"kind": "corrupted", "method": "none", "acc": 0.60},
            {"kind": "corrupted", "method": "spell", "acc": 0.75},
            {"kind": "corrupted", "method": "spell", "acc": 0.77},  # a second corrupted set: mean 0.76
            {"kind": "corrupted", "method": "masked_ttt", "acc": 0.62},
            {"kind": "corrupted", "method": "spell+masked_ttt", "acc": 0.70}]
    out = headline(rows, "spell")
    assert out["acc_default"] == pytest.approx(0.76) and out["acc_clean_default"] == pytest.approx(0.81)
    assert out["acc_corrupted_spell"] == pytest.approx(0.76) and out["acc_corrupted_spell-ttt"] == pytest.approx(0.70)
    assert out["recovered_fraction"] == pytest.approx(0.16 / 0.20)
    assert out["acc_ttt"] == pytest.approx(0.62)
    assert headline(rows)["acc_default"] == pytest.approx(0.60)  # no recommended defense: `none`
