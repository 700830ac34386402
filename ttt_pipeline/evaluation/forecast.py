"""The accuracy a window of unlabelled traffic loses to its noise, forecast from label-free descriptors (issue 69).

Calibration: the run's own graded corruption sets, whose drops against the clean test set are measured. Each set
is a point (family, severity, its window descriptors, its accuracy and drop); the clean test set is the reference,
where the drop is 0 by definition. The forecast is a monotone dose-response through the clean point: the drop is a
non-negative combination of the window's *excess* descriptors, max(0, window - clean), no intercept, so the clean
set forecasts 0, more noise never forecasts less drop, and a window cleaner than the test set forecasts none.
Two candidates (MODELS):

- `slope`: drop = k * excess repaired_words_share, k >= 0 (least squares through the origin): the words the
  default repair changes are the noise it can see;
- `nnls`: drop = sum_j c_j * excess descriptor_j, c_j >= 0, over repaired_words_share, oov_words_share and
  non_letter_character_share (scipy.optimize.nnls): also sees noise the repair leaves alone (symbols, words it does
  not know how to fix).

Choice: each candidate is fitted once per family on the other families' points and forecasts the held-out
family's points (leave one family out: a new kind of noise is the case that matters in production). `nnls` is
used only when its mean absolute held-out error is below `slope`'s by more than CHOICE_MARGIN (relative) and rounding, else
`slope`, the simpler: a win within the margin is noise, and a tie (both exact) is no reason for more parameters.
The chosen model is then fitted on all points. The prediction interval comes from the same held-out residuals (`_interval_scale`).

Baselines from the confidences alone (`baseline_drops`): AC (average confidence: the estimated accuracy is the
window's mean top-class probability), DoC (difference of confidences: the clean set's mean top-class probability
minus the window's, Guillory et al. 2021) and ATC (average thresholded confidence, Garg et al., ICLR 2022: the
threshold t at which the clean set's share of reviews above t equals its accuracy; the estimated accuracy is the
window's share above t). Drops are accuracy fractions, positive = accuracy lost, like the run's other differences.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Mapping, Sequence

import numpy as np
from scipy.optimize import nnls

from ttt_pipeline.errors import PipelineError
from ttt_pipeline.evaluation.descriptors import finite

VERSION = 1
MODELS: dict[str, tuple[str, ...]] = {
    "slope": ("repaired_words_share",),
    "nnls": ("repaired_words_share", "oov_words_share", "non_letter_character_share"),
}
CHOICE_MARGIN = 0.05  # nnls must cut slope's held-out error by more than 5 % to be chosen
_ROUNDING = 1e-9  # and by more than rounding (an accuracy fraction: far below one review in a million)
VERDICTS = ("ok", "noisy", "no_traffic")


@dataclass(frozen=True)
class CalibrationPoint:
    """A corrupted set: its family and severity, its window descriptors (descriptors.window_descriptors), its
    measured accuracy and its drop against clean (clean accuracy - set accuracy; None: computed so)."""

    family: str
    severity: int
    window: Mapping
    accuracy: float
    drop: float | None = None


@dataclass(frozen=True)
class CleanReference:
    """The clean test set: its window descriptors, its accuracy and each review's top-class probability (ATC's
    threshold is chosen on them)."""

    window: Mapping
    accuracy: float
    confidences: Sequence[float]


@dataclass(frozen=True)
class Calibration:
    """A fitted forecast and what the baselines need; `to_dict`/`from_dict` round-trip it through JSON.

    `features`/`coefficients`: the chosen model (`model`) over the excess of each feature above `clean` (the clean
    set's value); `half_width` and `scale_floor`: the interval, delta +- half_width * (delta + scale_floor);
    `held_out_errors`: each candidate's mean absolute leave-one-family-out error; `held_out`: per point, its
    family, severity, measured drop and the chosen model's held-out forecast; `baseline_errors`: AC's and DoC's mean
    absolute error on the same points."""

    model: str
    features: tuple[str, ...]
    coefficients: tuple[float, ...]
    clean: tuple[float, ...]
    confidence: float
    half_width: float
    scale_floor: float
    test_accuracy: float
    test_mean_confidence: float
    atc_threshold: float
    families: tuple[str, ...]
    held_out_errors: Mapping[str, float]
    baseline_errors: Mapping[str, float]
    held_out: tuple[Mapping, ...] = ()
    version: int = field(default=VERSION)

    def to_dict(self) -> dict:
        out = asdict(self)
        for key in ("features", "coefficients", "clean", "families"):
            out[key] = list(out[key])
        out["held_out"] = [dict(p) for p in self.held_out]
        out["held_out_errors"], out["baseline_errors"] = dict(self.held_out_errors), dict(self.baseline_errors)
        return out

    @classmethod
    def from_dict(cls, data: Mapping) -> "Calibration":
        if data.get("version") != VERSION:
            raise PipelineError(f"a forecast calibration of version {data.get('version')!r}; this release reads "
                                f"version {VERSION}", "fit the calibration again with this release")
        values = dict(data)
        for key in ("features", "coefficients", "clean", "families"):
            values[key] = tuple(values[key])
        values["held_out"] = tuple(dict(p) for p in values.get("held_out", ()))
        return cls(**values)


def _excess(windows: Sequence[Mapping], features: Sequence[str], clean: Sequence[float]) -> np.ndarray:
    """(points, features): max(0, window's value - clean's value)."""
    x = np.array([[finite(w, f) for f in features] for w in windows], dtype=float).reshape(len(windows), -1)
    return np.maximum(0.0, x - np.asarray(clean, dtype=float))


def _fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares without intercept (one column: the slope through the origin, clipped at 0)."""
    if not np.any(x):
        return np.zeros(x.shape[1])
    return nnls(x, y)[0]


def _held_out(x: np.ndarray, y: np.ndarray, families: np.ndarray) -> np.ndarray:
    """Each point's forecast by the model fitted on the other families' points."""
    out = np.empty(len(y))
    for fam in np.unique(families):
        held = families == fam
        out[held] = x[held] @ _fit(x[~held], y[~held])
    return out


def _interval_scale(forecast: np.ndarray, residual: np.ndarray, confidence: float) -> tuple[float, float]:
    """(half_width, scale_floor) of the interval delta +- half_width * (delta + scale_floor).

    Residuals grow with the drop: a slope that is off by some fraction misses a large drop by more than a small
    one, so held-out residuals are divided by (forecast + floor) before their quantile is taken and the interval
    widens with the forecast. The floor, the median held-out forecast, keeps the division sane at forecasts near 0,
    where what is left is the sets' own sampling noise, roughly the same for every set. The quantile is the split
    conformal one, the ceil((m + 1) * confidence)-th smallest of the m scaled absolute residuals (the largest
    when m is too small for it): under exchangeable sets it covers a new set's drop at least `confidence` of the
    time."""
    floor = max(float(np.median(np.abs(forecast))), 1e-3)
    scaled = np.sort(np.abs(residual) / (np.abs(forecast) + floor))
    rank = min(len(scaled), math.ceil((len(scaled) + 1) * confidence))
    return float(scaled[rank - 1]), floor


def atc_threshold(confidences: Sequence[float], accuracy: float) -> float:
    """ATC's threshold t: the share of `confidences` strictly above t is `accuracy` (to the nearest review;
    Garg et al. 2022). With k = round(accuracy * n), t is the (n - k)-th smallest confidence, or just below the
    smallest when k = n; ties above t can make the share larger."""
    s = np.sort(np.asarray(confidences, dtype=float))
    if s.size == 0 or not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"ATC needs confidences and an accuracy in [0, 1] (got {s.size} and {accuracy})")
    k = int(round(accuracy * s.size))
    return float(np.nextafter(s[0], -np.inf)) if k == s.size else float(s[s.size - k - 1])


def _point(p: CalibrationPoint | Mapping, clean_accuracy: float) -> CalibrationPoint:
    p = p if isinstance(p, CalibrationPoint) else CalibrationPoint(**p)
    return p if p.drop is not None else CalibrationPoint(p.family, p.severity, p.window, p.accuracy,
                                                         clean_accuracy - p.accuracy)


def fit_calibration(points: Sequence[CalibrationPoint | Mapping], clean: CleanReference,
                    confidence: float = 0.90) -> Calibration:
    """The forecast fitted on the corrupted sets `points` against `clean`, with its interval at `confidence`, and
    what AC, DoC and ATC need (module docstring: the models and the rule that chooses between them)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    pts = [_point(p, clean.accuracy) for p in points]
    families = np.array([p.family for p in pts])
    if len(set(families)) < 2:
        raise PipelineError(f"the forecast needs corrupted sets of at least two families, got {sorted(set(families))}",
                            "calibrate on more than one corruption family: the interval comes from held-out families")
    y = np.array([p.drop for p in pts], dtype=float)
    windows = [p.window for p in pts]
    held, errors = {}, {}
    for name, features in MODELS.items():
        base = [finite(clean.window, f) for f in features]
        held[name] = _held_out(_excess(windows, features, base), y, families)
        errors[name] = float(np.mean(np.abs(held[name] - y)))
    model = "nnls" if errors["nnls"] < (1 - CHOICE_MARGIN) * errors["slope"] - _ROUNDING else "slope"
    features = MODELS[model]
    base = tuple(finite(clean.window, f) for f in features)
    coefficients = _fit(_excess(windows, features, base), y)
    half_width, floor = _interval_scale(held[model], y - held[model], confidence)
    conf = np.asarray(clean.confidences, dtype=float)
    mean_conf = float(conf.mean())
    window_conf = np.array([finite(w, "mean_confidence") for w in windows])
    return Calibration(
        model=model, features=tuple(features), coefficients=tuple(float(c) for c in coefficients), clean=base,
        confidence=float(confidence), half_width=half_width, scale_floor=floor,
        test_accuracy=float(clean.accuracy), test_mean_confidence=mean_conf,
        atc_threshold=atc_threshold(conf, clean.accuracy), families=tuple(sorted(set(families))),
        held_out_errors=errors,
        baseline_errors={"ac": float(np.mean(np.abs(clean.accuracy - window_conf - y))),
                         "doc": float(np.mean(np.abs(mean_conf - window_conf - y)))},
        held_out=tuple({"family": p.family, "severity": int(p.severity), "drop": float(p.drop),
                        "forecast": float(f)} for p, f in zip(pts, held[model])))


def forecast(calibration: Calibration, window: Mapping) -> dict:
    """{"delta", "ci_low", "ci_high"}: the accuracy the window is forecast to lose against the clean test set
    (fraction; positive = lost) and its interval at the calibration's confidence."""
    x = _excess([window], calibration.features, calibration.clean)[0]
    delta = float(x @ np.asarray(calibration.coefficients))
    half = calibration.half_width * (delta + calibration.scale_floor)
    return {"delta": delta, "ci_low": delta - half, "ci_high": delta + half}


def average_confidence_drop(calibration: Calibration, window: Mapping) -> float:
    """AC: the test accuracy minus the window's mean top-class probability (its accuracy estimate)."""
    return calibration.test_accuracy - finite(window, "mean_confidence")


def doc_drop(calibration: Calibration, window: Mapping) -> float:
    """DoC: the clean test set's mean top-class probability minus the window's."""
    return calibration.test_mean_confidence - finite(window, "mean_confidence")


def atc_drop(calibration: Calibration, window: Mapping) -> float:
    """ATC: the test accuracy minus the window's share of reviews above the calibration's threshold; the window
    must have counted them against that threshold (descriptors.window_descriptors(..., threshold=t))."""
    share = finite(window, "share_above_threshold")
    if not math.isclose(float(window["threshold"]), calibration.atc_threshold, rel_tol=0.0, abs_tol=1e-12):
        raise ValueError(f"the window counted confidences above {window['threshold']}, the calibration's ATC "
                         f"threshold is {calibration.atc_threshold}")
    return calibration.test_accuracy - share


def baseline_drops(calibration: Calibration, window: Mapping) -> dict:
    """{"ac", "doc", "atc"}: the three confidence baselines' drops; "atc" is None when the window did not count
    confidences above a threshold."""
    atc = atc_drop(calibration, window) if window.get("share_above_threshold") is not None else None
    return {"ac": average_confidence_drop(calibration, window), "doc": doc_drop(calibration, window), "atc": atc}


def verdict(forecast: Mapping | None, max_drop: float, n: int, min_n: int = 1) -> str:
    """`no_traffic` when the window has fewer than `min_n` reviews (0 by default); `noisy` only when the whole
    interval lies above `max_drop` (the drop is significantly larger than allowed); else `ok`."""
    if n < min_n:
        return "no_traffic"
    if forecast is None:
        raise ValueError(f"a window of {n} reviews needs its forecast")
    return "noisy" if forecast["ci_low"] > max_drop else "ok"
