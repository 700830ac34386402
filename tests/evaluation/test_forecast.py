"""The label-free drop forecast: slopes recovered, intervals that cover, ATC's threshold, JSON and verdicts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ttt_pipeline.errors import PipelineError
from ttt_pipeline.evaluation.forecast import (
    Calibration,
    CalibrationPoint,
    CleanReference,
    atc_threshold,
    baseline_drops,
    fit_calibration,
    forecast,
    verdict,
)

CLEAN = {"repaired_words_share": 0.01, "oov_words_share": 0.05, "non_letter_character_share": 0.04,
         "mean_confidence": 0.9}


def _window(rws: float, oov: float = 0.0, non_letter: float = 0.0, conf: float = 0.85) -> dict:
    return {"repaired_words_share": CLEAN["repaired_words_share"] + rws,
            "oov_words_share": CLEAN["oov_words_share"] + oov,
            "non_letter_character_share": CLEAN["non_letter_character_share"] + non_letter, "mean_confidence": conf}


def _clean(accuracy: float = 0.9) -> CleanReference:
    return CleanReference(CLEAN, accuracy, np.linspace(0.6, 1.0, 50))


def _points(drop, families=("keyboard", "ocr", "char_drop", "misspelling", "case"), seed=0):
    """Five severities per family; each family sees the noise at its own rate per severity."""
    rng = np.random.default_rng(seed)
    out = []
    for f, fam in enumerate(families):
        for sev in range(1, 6):
            rws, other = 0.02 * sev * (1 + 0.3 * f), rng.uniform(0, 0.05)
            out.append(CalibrationPoint(fam, sev, _window(rws, other, rng.uniform(0, 0.05)),
                                        accuracy=0.9 - drop(rws, other)))
    return out


def test_linear_dose_response_recovers_its_slope_and_clean_forecasts_zero():
    cal = fit_calibration(_points(lambda rws, _: 0.8 * rws), _clean())
    assert cal.model == "slope" and cal.coefficients == pytest.approx((0.8,), abs=1e-9)
    assert cal.held_out_errors["slope"] == pytest.approx(0.0, abs=1e-9)
    assert forecast(cal, CLEAN)["delta"] == 0.0
    assert forecast(cal, _window(0.1))["delta"] == pytest.approx(0.08)
    assert forecast(cal, _window(-0.01))["delta"] == 0.0  # cleaner than the test set: no drop, never a gain
    f = forecast(cal, _window(0.1))
    assert f["ci_low"] <= f["delta"] <= f["ci_high"]


def test_noise_the_repair_cannot_see_chooses_the_multi_descriptor_model():
    cal = fit_calibration(_points(lambda rws, oov: 0.5 * rws + 2.0 * oov), _clean())
    assert cal.model == "nnls" and cal.held_out_errors["nnls"] < cal.held_out_errors["slope"]
    assert cal.coefficients == pytest.approx((0.5, 2.0, 0.0), abs=1e-9)


def _noisy_points(rng, families, slope=0.8):
    """Drops that grow with the dose, each family with its own slope, residuals growing with the drop."""
    out = []
    for fam in families:
        k = slope * (1 + 0.15 * rng.standard_normal())
        for sev in range(1, 6):
            rws = 0.03 * sev * rng.uniform(0.5, 1.5)
            drop = k * rws * (1 + 0.1 * rng.standard_normal()) + 0.004 * rng.standard_normal()
            out.append(CalibrationPoint(fam, sev, _window(rws, rng.uniform(0, 0.02)), 0.9 - drop, drop))
    return out


def test_interval_covers_held_out_sets_at_about_the_stated_rate():
    rng = np.random.default_rng(7)
    covered = []
    for _ in range(20):
        cal = fit_calibration(_noisy_points(rng, [f"f{i}" for i in range(8)]), _clean(), confidence=0.9)
        for p in _noisy_points(rng, [f"new{i}" for i in range(20)]):
            f = forecast(cal, p.window)
            covered.append(f["ci_low"] <= p.drop <= f["ci_high"])
    assert 0.85 <= np.mean(covered) <= 0.97


def test_atc_threshold_leaves_the_test_accuracys_share_above_it():
    conf = [0.9, 0.55, 0.95, 0.7, 0.6, 0.8]
    assert atc_threshold(conf, 4 / 6) == 0.6  # 0.7, 0.8, 0.9, 0.95 above
    assert atc_threshold(conf, 0.5) == 0.7
    assert atc_threshold(conf, 0.0) == 0.95
    assert atc_threshold(conf, 1.0) < 0.55 < np.nextafter(atc_threshold(conf, 1.0), 1.0) + 1e-12


def test_baselines_from_confidences():
    clean = CleanReference(CLEAN, 4 / 6, [0.9, 0.55, 0.95, 0.7, 0.6, 0.8])
    cal = fit_calibration(_points(lambda rws, _: 0.8 * rws), clean)
    assert cal.atc_threshold == 0.6 and cal.test_mean_confidence == pytest.approx(0.75)
    window = {"mean_confidence": 0.6875, "threshold": 0.6, "share_above_threshold": 0.5}
    drops = baseline_drops(cal, window)
    assert drops["ac"] == pytest.approx(4 / 6 - 0.6875)
    assert drops["doc"] == pytest.approx(0.75 - 0.6875)
    assert drops["atc"] == pytest.approx(4 / 6 - 0.5)
    assert baseline_drops(cal, {"mean_confidence": 0.7})["atc"] is None
    with pytest.raises(ValueError, match="ATC threshold is 0.6"):
        baseline_drops(cal, {**window, "threshold": 0.7})


def test_calibration_round_trips_through_json():
    cal = fit_calibration(_noisy_points(np.random.default_rng(1), ["a", "b", "c"]), _clean())
    again = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert again == cal
    assert forecast(again, _window(0.05)) == forecast(cal, _window(0.05))
    with pytest.raises(PipelineError, match="version 0"):
        Calibration.from_dict({**cal.to_dict(), "version": 0})


def test_one_family_cannot_calibrate_and_a_window_without_the_descriptor_cannot_forecast():
    with pytest.raises(PipelineError, match="at least two families"):
        fit_calibration(_points(lambda rws, _: rws, families=("keyboard",)), _clean())
    cal = fit_calibration(_points(lambda rws, _: 0.8 * rws), _clean())
    with pytest.raises(ValueError, match="repaired_words_share"):
        forecast(cal, {"oov_words_share": 0.1, "n": 0})


def test_verdict_is_noisy_only_when_the_whole_interval_exceeds_the_limit():
    assert verdict(None, 0.05, n=0) == "no_traffic"
    assert verdict({"delta": 0.5, "ci_low": 0.4, "ci_high": 0.6}, 0.05, n=3, min_n=10) == "no_traffic"
    assert verdict({"delta": 0.08, "ci_low": 0.06, "ci_high": 0.1}, 0.05, n=100) == "noisy"
    assert verdict({"delta": 0.08, "ci_low": 0.04, "ci_high": 0.12}, 0.05, n=100) == "ok"
    assert verdict({"delta": 0.07, "ci_low": 0.05, "ci_high": 0.09}, 0.05, n=100) == "ok"
