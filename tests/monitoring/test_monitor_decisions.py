"""The traffic monitor's decisions on synthetic windows (no store, no MLflow): the window's bounds, the version it
is judged as, its descriptors from the store's sums, and the verdicts ok / noisy / no_traffic."""

from __future__ import annotations

import datetime as dt

import pytest
from monitoring_helpers import CLEAN, SLOPE, calibration, payload

from ttt_pipeline import monitoring
from ttt_pipeline.errors import ConfigError, PipelineError
from ttt_pipeline.evaluation.forecast import forecast

UTC = dt.timezone.utc


@pytest.mark.parametrize("text, seconds", [("24h", 86400), ("7d", 604800), ("30m", 1800), ("90s", 90),
                                           ("2w", 1209600), (" 1h ", 3600)])
def test_windows_parse(text, seconds):
    assert monitoring.parse_window(text) == dt.timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["24", "h", "0h", "1.5h", "-1h", "24 h", "1y", ""])
def test_a_bad_window_names_the_forms(text):
    with pytest.raises(ConfigError, match="not a duration") as err:
        monitoring.parse_window(text)
    assert "24h" in err.value.hint


def test_window_bounds_end_at_the_given_time_in_utc():
    start, end = monitoring.window_bounds("2h", "2024-05-01T12:00:00+02:00")
    assert (start, end) == (dt.datetime(2024, 5, 1, 8, tzinfo=UTC), dt.datetime(2024, 5, 1, 10, tzinfo=UTC))
    assert monitoring.window_bounds("1h", "2024-05-01T10:00:00")[1] == dt.datetime(2024, 5, 1, 10, tzinfo=UTC)
    now = dt.datetime(2030, 1, 1, tzinfo=UTC)
    assert monitoring.window_bounds("1d", None, now) == (now - dt.timedelta(days=1), now)
    with pytest.raises(ConfigError, match="ISO-8601"):
        monitoring.window_bounds("1h", "yesterday")


@pytest.mark.parametrize("method, repair", [("spell", "spell"), ("spell+masked_ttt", "spell"), ("none", "spell"),
                                            ("masked_ttt", "spell"), ("dedupe+spell+tent", "dedupe+spell")])
def test_descriptors_measure_the_default_defense_repair(method, repair):
    assert monitoring.descriptor_method(method) == repair


def test_a_window_is_judged_as_the_version_that_served_most_of_it():
    assert monitoring.pick_version({"1": 10, "2": 30}) == ("2", {"1": 10})
    assert monitoring.pick_version({"2": 5, "10": 5}) == ("10", {"2": 5})  # a tie: the newer version
    assert monitoring.only_model({"reviews": {"1": 3}}) == "reviews"
    with pytest.raises(PipelineError, match=r"a \(3 records\), b \(1 records\)") as err:
        monitoring.only_model({"b": {"1": 1}, "a": {"1": 2, "2": 1}})
    assert "--model" in err.value.hint


def _read(n: int, rws: float, labels=None, changed: int = 0, above: int | None = None, threshold=None) -> dict:
    """A traffic_window.read_window dict of `n` records whose descriptors are the clean set's but `rws`."""
    means = {"text_length": 80.0, "word_count": 15.0, "oov_words_share": CLEAN["oov_words_share"],
             "repaired_words_share": rws, "non_letter_character_share": CLEAN["non_letter_character_share"],
             "foreign_script_share": 0.0}
    return {"n": n, "sums": {k: v * n for k, v in means.items()}, "means": means, "mean_probability": 0.85,
            "labels": labels if labels is not None else {"neg": n // 2, "pos": n - n // 2}, "truncated": 0,
            "raw_label_recorded": changed, "raw_label_changed": changed, "above_threshold": above,
            "threshold": threshold, "skipped_parts": [], "model_versions": {}}


def test_window_descriptors_from_the_store_sums():
    cal = calibration()
    read = _read(200, 0.2, labels={"neg": 150, "pos": 50}, changed=30, above=120, threshold=cal.atc_threshold)
    w = monitoring.window_descriptors(read, ["neg", "pos"], payload()["reference"])
    assert w["n"] == 200 and w["repaired_words_share"] == pytest.approx(0.2)
    assert w["mean_confidence"] == pytest.approx(0.85) and w["defense_change_rate"] == pytest.approx(0.15)
    assert w["label_shares"] == {"neg": 0.75, "pos": 0.25} and w["label_share_shift"] == pytest.approx(0.25)
    assert w["share_above_threshold"] == pytest.approx(0.6) and w["threshold"] == cal.atc_threshold
    # the reference's shares as a mapping, or as a list in another label order
    assert monitoring.reference_shares({"label_shares": {"pos": 0.3, "neg": 0.7}}, ["neg", "pos"]) == [0.7, 0.3]
    assert monitoring.reference_shares({"label_shares": [0.3, 0.7], "label_names": ["pos", "neg"]},
                                       ["neg", "pos"]) == [0.7, 0.3]
    assert monitoring.reference_shares({}, ["neg", "pos"]) is None


def test_clean_traffic_is_ok_and_noisy_traffic_is_noisy():
    cal = calibration()
    ref = payload()["reference"]
    clean = monitoring.window_descriptors(_read(200, CLEAN["repaired_words_share"], above=150,
                                                threshold=cal.atc_threshold), ["neg", "pos"], ref)
    ok = monitoring.judge(cal, clean, max_drop=0.03, min_records=50)
    assert ok["verdict"] == "ok" and ok["forecast_drop"]["delta"] == 0.0
    assert ok["baselines"]["ac"] == pytest.approx(0.9 - 0.85) and ok["baselines"]["atc"] == pytest.approx(0.9 - 0.75)
    noisy_w = monitoring.window_descriptors(_read(200, 0.2), ["neg", "pos"], ref)
    noisy = monitoring.judge(cal, noisy_w, max_drop=0.03, min_records=50)
    assert noisy["verdict"] == "noisy" and noisy["forecast_drop"] == forecast(cal, noisy_w)
    assert noisy["forecast_drop"]["delta"] == pytest.approx(SLOPE * (0.2 - CLEAN["repaired_words_share"]), rel=0.05)
    assert noisy["forecast_drop"]["ci_low"] > 0.03 and noisy["baselines"]["atc"] is None  # no ATC count asked
    # the same noise, allowed a larger drop: ok
    assert monitoring.judge(cal, noisy_w, max_drop=0.5, min_records=50)["verdict"] == "ok"


def test_too_few_records_is_no_traffic_with_or_without_a_calibration():
    cal = calibration()
    few = monitoring.window_descriptors(_read(20, 0.2), ["neg", "pos"])
    assert monitoring.judge(cal, few, 0.03, 50)["verdict"] == "no_traffic"
    assert monitoring.judge(None, few, 0.03, 50) == {"verdict": "no_traffic", "forecast_drop": None,
                                                     "baselines": None}
    empty = monitoring.window_descriptors(_read(0, 0.0, labels={}), ["neg", "pos"])
    assert monitoring.judge(cal, empty, 0.03, 1)["verdict"] == "no_traffic"
    with pytest.raises(PipelineError, match="no forecast calibration") as err:
        monitoring.judge(None, monitoring.window_descriptors(_read(60, 0.2), ["neg", "pos"]), 0.03, 50)
    assert "--calibration" in err.value.hint


def test_summary_metrics_event_and_exit_codes():
    cal = calibration()
    bounds = monitoring.window_bounds("1h", "2024-05-01T10:00:00Z")
    read = _read(200, 0.2)
    window = monitoring.window_descriptors(read, ["neg", "pos"], payload()["reference"])
    judged = monitoring.judge(cal, window, 0.03, 50)
    s = monitoring.summary(judged=judged, window=window, model_name="reviews", model_version="3",
                           other_versions={"2": 4}, bounds=bounds, duration="1h", max_drop=0.03, min_records=50,
                           read=read, calibration=cal, traffic_uri="/srv/traffic")
    assert s["verdict"] == "noisy" and s["n"] == 200 and s["window"]["end"] == "2024-05-01T10:00:00+00:00"
    assert set(s["forecast_drop"]) == {"delta", "ci_low", "ci_high"} and set(s["baselines"]) == {"ac", "doc", "atc"}
    assert s["calibration"]["model"] == cal.model and s["calibration"]["families"] == list(cal.families)
    m = monitoring.metrics(s)
    assert m["noisy"] == 1.0 and m["n"] == 200 and m["forecast_drop"] == s["forecast_drop"]["delta"]
    assert m["forecast_drop_ci_low"] == s["forecast_drop"]["ci_low"] and m["label_share/neg"] == 0.5
    assert m["repaired_words_share"] == pytest.approx(0.2) and "baseline_atc" not in m
    event = monitoring.event_payload({**s, "mlflow_run_id": "r" * 32})
    assert event["forecast_points"] == monitoring.points(s["forecast_drop"]) and event["max_drop_points"] == "3.00"
    assert event["descriptors"]["repaired_words_share"] == pytest.approx(0.2) and event["mlflow_run_id"] == "r" * 32
    assert [monitoring.exit_code(v) for v in ("ok", "noisy", "no_traffic")] == [0, 3, 0]
    assert "noisy: 200 records, forecast drop +" in monitoring.console_line(s)
    assert monitoring.points({"delta": 0.081, "ci_low": 0.05, "ci_high": 0.113}) == "+8.10 [+5.00, +11.30]"
