"""Paired statistics: interval coverage on simulated data, McNemar against statsmodels, pooling over draws."""

from __future__ import annotations

import numpy as np
import pytest

from ttt_pipeline.evaluation.stats import (
    accuracy_interval,
    format_difference,
    macro_f1,
    mcnemar_exact,
    paired_difference,
)


def _paired(rng, n: int, p_a: float, delta: float, discordance: float = 0.2):
    """Correctness of a and b on n reviews with E[b - a] = delta: a fixed share of reviews is discordant and
    split between helped and hurt so that their difference is delta."""
    a = rng.random(n) < p_a
    b = a.copy()
    flip = rng.random(n) < discordance
    # among discordant reviews, b is right with probability (1 + delta / discordance) / 2
    b_right = rng.random(n) < 0.5 * (1 + delta / discordance)
    a[flip] = ~b_right[flip]
    b[flip] = b_right[flip]
    return a, b


def test_intervals_cover_the_true_difference_93_to_97_percent():
    """1,000 simulated paired sets of 300 reviews with a known difference of +3 points: the 95% intervals
    must cover it in 93-97% of them."""
    rng = np.random.default_rng(12345)
    delta, covered, runs = 0.03, 0, 1000
    for i in range(runs):
        a, b = _paired(rng, 300, 0.6, delta)
        d = paired_difference(a, b, resamples=2000, seed=i)
        covered += d.ci_low <= delta <= d.ci_high
    assert 0.93 <= covered / runs <= 0.97, covered / runs


@pytest.mark.parametrize("table", [[[50, 3], [12, 35]], [[10, 0], [0, 10]], [[0, 7], [1, 0]], [[40, 20], [21, 19]]])
def test_mcnemar_matches_statsmodels(table):
    from statsmodels.stats.contingency_tables import mcnemar

    helped, hurt = table[1][0], table[0][1]
    expected = mcnemar(table, exact=True).pvalue if helped + hurt else 1.0
    assert mcnemar_exact(helped, hurt) == pytest.approx(expected, abs=1e-12)


def test_difference_fields_counts_and_verdict():
    a = np.array([1, 1, 0, 0, 1, 0, 1, 0] * 50, dtype=bool)
    b = np.array([1, 1, 1, 1, 1, 0, 1, 0] * 50, dtype=bool)
    d = paired_difference(a, b, resamples=2000, seed=0)
    assert d.delta == pytest.approx(0.25) and (d.helped, d.hurt, d.n) == (100, 0, 400)
    assert d.ci_low > 0 and d.significant and d.p_mcnemar < 1e-20
    assert format_difference(d).startswith("+25.00 [") and format_difference(d).endswith("significant")
    same = paired_difference(a, a, resamples=2000)
    assert (same.delta, same.ci_low, same.ci_high, same.significant, same.p_mcnemar) == (0, 0, 0, False, 1.0)


def test_interval_is_seeded_and_needs_2000_resamples_to_be_stable():
    rng = np.random.default_rng(0)
    a, b = _paired(rng, 400, 0.55, 0.01)
    one, two = paired_difference(a, b, seed=3), paired_difference(a, b, seed=3)
    assert (one.ci_low, one.ci_high) == (two.ci_low, two.ci_high)
    other = paired_difference(a, b, seed=4)
    assert abs(other.ci_low - one.ci_low) < 0.01


def test_pooling_over_draws_averages_per_review_before_resampling():
    """Three mask seeds of b on the same reviews: the delta is the mean over seeds, helped/hurt count reviews
    whose mean correctness rose/fell, and the interval is no narrower than a single draw's of equal effect."""
    rng = np.random.default_rng(1)
    n = 400
    a = rng.random(n) < 0.55
    draws = np.stack([a ^ (rng.random(n) < 0.05) for _ in range(3)], axis=1)
    d = paired_difference(a, draws, resamples=2000)
    assert d.delta == pytest.approx(draws.mean() - a.mean())
    per_review = draws.mean(1) - a
    assert d.helped == int((per_review > 0).sum()) and d.hurt == int((per_review < 0).sum())
    assert d.n == n
    with pytest.raises(ValueError, match="same reviews"):
        paired_difference(a, draws[:10])


def test_macro_f1_difference_and_accuracy_interval():
    y = np.array([0, 1, 2, 0, 1, 2] * 40)
    pa = np.where(np.arange(len(y)) % 3 == 0, (y + 1) % 3, y)  # a third wrong
    pb = y.copy()
    d = paired_difference(pa == y, pb == y, labels=y, pred_a=pa, pred_b=pb, n_classes=3, resamples=2000)
    f1_a = macro_f1(y, pa, 3)[0]
    assert d.macro_f1_delta == pytest.approx(1.0 - f1_a)
    assert d.macro_f1_ci_low <= d.macro_f1_delta <= d.macro_f1_ci_high
    lo, hi = accuracy_interval(pa == y)
    assert lo < (pa == y).mean() < hi
