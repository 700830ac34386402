"""Paired statistics for accuracy differences: bootstrap intervals (scipy) and exact McNemar tests (statsmodels).

Every difference the pipeline reports compares two methods (or two conditions) on the *same* reviews, so the
review is the unit of resampling. When a method is scored several times on one review (mask seeds, several
corrupted sets of the same test reviews), its per-review correctness is first averaged over those draws, and
the bootstrap resamples reviews: a cluster bootstrap that keeps the draws of one review together instead of
treating them as independent evidence. The McNemar test then counts a review as helped (its mean correctness
rose) or hurt (fell); on a single draw this is exactly McNemar's table, and on several it is the exact sign
test of the per-review changes, which stays valid because reviews are independent while draws are not.

A difference is called significant only when its interval excludes 0.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass

import numpy as np

RESAMPLES = 2000
CONFIDENCE = 0.95


@dataclass
class Difference:
    """b minus a on paired data, in accuracy points as fractions (0.05 = 5 points)."""

    delta: float
    ci_low: float
    ci_high: float
    p_mcnemar: float
    helped: int
    hurt: int
    significant: bool
    n: int
    macro_f1_delta: float | None = None
    macro_f1_ci_low: float | None = None
    macro_f1_ci_high: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _as_matrix(x) -> np.ndarray:
    """Correctness as reviews x draws (a 1-D vector is one draw)."""
    a = np.asarray(x, dtype=float)
    return a[:, None] if a.ndim == 1 else a


def bootstrap_interval(values: np.ndarray, resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-review values (scipy.stats.bootstrap).

    Percentile, not BCa: BCa's acceleration is undefined when every review agrees (all values equal, common on
    clean text), where scipy returns NaN; the percentile interval is then the point itself."""
    from scipy.stats import bootstrap

    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return float("nan"), float("nan")
    if np.all(v == v[0]):
        return float(v[0]), float(v[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = bootstrap((v,), np.mean, n_resamples=resamples, confidence_level=confidence, method="percentile",
                        vectorized=True, random_state=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def mcnemar_exact(helped: int, hurt: int) -> float:
    """Exact McNemar p-value from the discordant counts (statsmodels; the concordant cells do not enter)."""
    from statsmodels.stats.contingency_tables import mcnemar

    if helped + hurt == 0:
        return 1.0
    return float(mcnemar([[0, hurt], [helped, 0]], exact=True).pvalue)


def macro_f1(y_true: np.ndarray, y_pred: np.ndarray, n_classes: int) -> np.ndarray:
    """Macro-F1 over the classes present in y_true, for each row (resample) of 2-D class-id arrays at once."""
    y_true, y_pred = np.atleast_2d(y_true), np.atleast_2d(y_pred)
    r = y_true.shape[0]
    cells = (np.arange(r)[:, None] * n_classes + y_true) * n_classes + y_pred
    m = np.bincount(cells.ravel(), minlength=r * n_classes * n_classes).reshape(r, n_classes, n_classes)
    tp, support, predicted = np.diagonal(m, axis1=1, axis2=2), m.sum(2), m.sum(1)
    denom = support + predicted
    f1 = np.divide(2 * tp, denom, out=np.zeros(tp.shape), where=denom > 0)
    present = support > 0
    return np.where(present.any(1), (f1 * present).sum(1) / np.maximum(present.sum(1), 1), 0.0)


def _f1_difference(labels, pred_a, pred_b, n_classes, resamples, confidence, seed):
    """Macro-F1 of b minus a (each averaged over its draws), with a paired percentile bootstrap over reviews."""
    y = np.asarray(labels, dtype=np.int64)
    pa, pb = np.atleast_2d(np.asarray(pred_a, dtype=np.int64).T), np.atleast_2d(np.asarray(pred_b, dtype=np.int64).T)

    def stat(idx: np.ndarray) -> np.ndarray:
        fa = np.mean([macro_f1(y[idx], d[idx], n_classes) for d in pa], axis=0)
        fb = np.mean([macro_f1(y[idx], d[idx], n_classes) for d in pb], axis=0)
        return fb - fa

    point = float(stat(np.arange(len(y))[None, :])[0])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(y), size=(resamples, len(y)))
    boot = stat(idx)
    alpha = (1 - confidence) / 2
    return point, float(np.quantile(boot, alpha)), float(np.quantile(boot, 1 - alpha))


def paired_difference(correct_a, correct_b, *, labels=None, pred_a=None, pred_b=None, n_classes: int | None = None,
                      resamples: int = RESAMPLES, confidence: float = CONFIDENCE, seed: int = 0) -> Difference:
    """Accuracy of b minus a on the same reviews, with its interval, McNemar p and helped / hurt counts.

    `correct_a`, `correct_b`: 0/1 per review, or reviews x draws (mask seeds, sets) to pool over. With `labels`,
    `pred_a`, `pred_b` (same shapes, class ids) and `n_classes`, the macro-F1 difference is added."""
    a, b = _as_matrix(correct_a), _as_matrix(correct_b)
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"paired data must cover the same reviews: {a.shape[0]} vs {b.shape[0]}")
    per_review = b.mean(1) - a.mean(1)
    lo, hi = bootstrap_interval(per_review, resamples, confidence, seed)
    helped, hurt = int((per_review > 1e-12).sum()), int((per_review < -1e-12).sum())
    out = Difference(delta=float(per_review.mean()), ci_low=lo, ci_high=hi, p_mcnemar=mcnemar_exact(helped, hurt),
                     helped=helped, hurt=hurt, significant=bool(lo > 0 or hi < 0), n=int(a.shape[0]))
    if labels is not None and pred_a is not None and pred_b is not None and n_classes:
        out.macro_f1_delta, out.macro_f1_ci_low, out.macro_f1_ci_high = _f1_difference(
            labels, pred_a, pred_b, n_classes, resamples, confidence, seed)
    return out


def recovered_fraction_interval(correct_clean, correct_corrupted, correct_defended, resamples: int = RESAMPLES,
                                confidence: float = CONFIDENCE, seed: int = 0) -> tuple[float, float, float]:
    """Share of the corruption drop a defense wins back on the same reviews, with its interval:
    (acc_defended - acc_corrupted) / (acc_clean - acc_corrupted), each side's correctness first averaged per review
    over its draws (reviews x draws, as paired_difference), and a paired percentile bootstrap over reviews (the
    resampled ratio, resamples whose drop is not positive left out). NaNs when the drop itself is not positive."""
    c, k, d = (_as_matrix(x).mean(1) for x in (correct_clean, correct_corrupted, correct_defended))
    if not len(c) == len(k) == len(d):
        raise ValueError(f"paired data must cover the same reviews: {len(c)}, {len(k)}, {len(d)}")
    drop, gain = c - k, d - k
    nan = float("nan")
    if drop.sum() <= 0:
        return nan, nan, nan
    point = float(gain.sum() / drop.sum())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(c), size=(resamples, len(c)))
    den, num = drop[idx].sum(1), gain[idx].sum(1)
    ok = den > 0
    if not ok.any():
        return point, nan, nan
    ratios = num[ok] / den[ok]
    alpha = (1 - confidence) / 2
    return point, float(np.quantile(ratios, alpha)), float(np.quantile(ratios, 1 - alpha))


def accuracy_interval(correct, resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
                      seed: int = 0) -> tuple[float, float]:
    """Bootstrap interval of one accuracy (reviews x draws pooled per review): the bars of the plots."""
    return bootstrap_interval(_as_matrix(correct).mean(1), resamples, confidence, seed)


def verdict(d: dict | Difference) -> str:
    d = d.to_dict() if isinstance(d, Difference) else d
    return "significant" if d["significant"] else "not significant"


def format_difference(d: dict | Difference, points: bool = True) -> str:
    """`+5.75 [+1.25, +10.00] significant` (accuracy points), the one way intervals are printed."""
    d = d.to_dict() if isinstance(d, Difference) else d
    k = 100.0 if points else 1.0
    return f"{d['delta'] * k:+.2f} [{d['ci_low'] * k:+.2f}, {d['ci_high'] * k:+.2f}] {verdict(d)}"


def min_detectable_drop(n: int, threshold: float = 0.0, confidence: float = CONFIDENCE,
                        power: float = 0.8) -> float | None:
    """The smallest drop in accuracy (a fraction) that a paired alarm on `n` reviews detects with `power`.

    The alarm fires when the whole (two-sided, `confidence`) interval of the paired change lies below
    -`threshold`. In the most favourable case, a drop made only of reviews newly got wrong (no review fixed), the
    per-review change has variance d(1 - d), so the alarm sees a drop d with this power when
    d - threshold >= (z_{1-alpha/2} + z_power) * sqrt(d (1 - d) / n). Any review that flips the other way widens
    the interval, so the true detectable drop is at least this: a lower bound, e.g. 129 reviews cannot see a
    2-point regression (9.1 points at threshold 0.02). None when even a drop to zero accuracy is not detectable.
    """
    from scipy.optimize import brentq
    from scipy.stats import norm

    if n < 1:
        return None
    z = norm.ppf(1 - (1 - confidence) / 2) + norm.ppf(power)

    def gap(d: float) -> float:
        return d - threshold - z * np.sqrt(d * (1 - d) / n)

    lo, hi = max(threshold, 1e-9), 1 - 1e-12
    if gap(hi) < 0:
        return None
    return float(brentq(gap, lo, hi)) if gap(lo) < 0 else float(lo)
