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
    out = headline(rows)
    assert "recovered_fraction" not in out
    assert out["acc_ttt"] == pytest.approx(0.444)
    rows[1]["acc"] = 0.324
    assert headline(rows)["recovered_fraction"] == pytest.approx(0.12 / 0.1)
