"""`ttt-pipeline monitor` on a traffic store written here: the JSON contract, the exit status of each verdict,
the version's monitoring run in MLflow (one step per window, the plot), retention, a part cut short, and the
clear error without a calibration."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from monitoring_helpers import CLEAN, SLOPE, payload

from ttt_pipeline.io.traffic_capture import TrafficWriter

UTC = dt.timezone.utc
T0 = dt.datetime(2024, 5, 1, 8, 0, tzinfo=UTC)  # clean traffic 08:00-09:00, noisy 09:00-10:00


def _row(i: int, ts: dt.datetime, rws: float, **over) -> dict:
    row = dict(ts=ts, model_name="reviews", model_version="3", method="spell", label="neg" if i % 2 else "pos",
               probability=0.7 if i % 4 else 0.95, raw_label=None, text=f"review {i}", text_length=60,
               word_count=12, oov_words_share=CLEAN["oov_words_share"], repaired_words_share=rws,
               non_letter_character_share=CLEAN["non_letter_character_share"], foreign_script_share=0.0,
               truncated=False)
    row.update(over)
    return row


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("monitor-cli")
    uri = tmp / "traffic"
    rows = [_row(i, T0 + dt.timedelta(seconds=30 * i), CLEAN["repaired_words_share"]) for i in range(100)]
    rows += [_row(i, T0 + dt.timedelta(hours=1, seconds=30 * i), 0.2, raw_label="pos" if i % 5 == 0 else None)
             for i in range(100)]
    rows += [_row(i, T0 + dt.timedelta(hours=1, seconds=30 * i), 0.9, model_name="other") for i in range(10)]
    rows += [_row(i, T0 + dt.timedelta(hours=1, minutes=10), 0.2, model_version="2") for i in range(7)]
    rows += [_row(i, T0 + dt.timedelta(hours=1, seconds=30 * i), 0.2, model_name="registered", model_version="1")
             for i in range(60)]
    w = TrafficWriter(uri, flush_rows=1000)
    w.record(rows)
    w.close()
    assert w.stats()["written"] == len(rows)
    day = uri / "date=2024-05-01"
    (day / "part-crashed.parquet").write_bytes(b"PAR1 cut short by a crash")
    (uri / "date=2000-01-01").mkdir()
    (uri / "date=2000-01-01" / "part-old.parquet").write_bytes(b"old")
    cal = tmp / "calibration.json"
    cal.write_text(json.dumps(payload()))
    return {"tmp": tmp, "uri": uri, "calibration": cal}


def _monitor(store, capsys, end: str, *extra: str) -> tuple[int, dict | None, str]:
    from ttt_pipeline.cli.main import main

    tmp = store["tmp"]
    args = ["monitor", "--config", "demo", "--set", f"monitoring.traffic_uri={store['uri']}",
            "--set", f"tracking.tracking_uri=sqlite:///{tmp}/mlflow.db", "--set", f"tracking.artifact_root={tmp}/mlruns",
            "--set", "monitoring.retention_days=100000", "--window", "1h", "--end", end, "--json", *extra]
    rc = main(args)
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    return rc, (json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None), captured.out + captured.err


@pytest.fixture(scope="module")
def judged(store):
    """The clean hour, then the noisy hour, of model `reviews`."""
    import _pytest.capture

    out = {}
    capture = _pytest.capture.CaptureFixture(_pytest.capture.SysCapture, request=None, _ispytest=True)
    capture._start()
    try:
        for name, end in (("clean", "2024-05-01T09:00:00Z"), ("noisy", "2024-05-01T10:00:00Z")):
            out[name] = _monitor(store, capture, end, "--model", "reviews", "--calibration", str(store["calibration"]))
    finally:
        capture.close()
    return out


def test_clean_traffic_is_ok_with_rc_0(judged, monkeypatch):
    rc, s, text = judged["clean"]
    assert rc == 0, text
    assert s["verdict"] == "ok" and s["n"] == 100 and (s["model_name"], s["model_version"]) == ("reviews", "3")
    assert s["forecast_drop"] == {"delta": 0.0, "ci_low": pytest.approx(s["forecast_drop"]["ci_low"]),
                                  "ci_high": pytest.approx(s["forecast_drop"]["ci_high"])}
    assert s["forecast_drop"]["ci_high"] < 0.03
    assert s["descriptors"]["repaired_words_share"] == pytest.approx(CLEAN["repaired_words_share"])
    assert s["descriptors"]["label_shares"] == {"neg": 0.5, "pos": 0.5} and s["descriptors"]["label_share_shift"] == 0
    mean_p = (25 * 0.95 + 75 * 0.7) / 100
    assert s["descriptors"]["mean_confidence"] == pytest.approx(mean_p)
    assert s["baselines"]["ac"] == pytest.approx(0.9 - mean_p) and s["baselines"]["doc"] == pytest.approx(0.8 - mean_p)
    assert "ok: 100 records" in text and "no event sent (ttt.traffic.ok: PREFECT_API_URL unset)" in text


def test_noisy_traffic_is_noisy_with_rc_3(judged):
    rc, s, text = judged["noisy"]
    assert rc == 3, text
    assert s["verdict"] == "noisy" and s["n"] == 100 and s["other_versions"] == {"2": 7}  # v2's 7 records apart
    fc = s["forecast_drop"]
    assert fc["delta"] == pytest.approx(SLOPE * (0.2 - CLEAN["repaired_words_share"]), rel=0.05) and fc["ci_low"] > 0.03
    # a raw_label on every fifth record, differing from the served label on the odd ones: 10 of 100
    assert s["descriptors"]["defense_change_rate"] == pytest.approx(0.1)
    # ATC: the share above the calibration's threshold, counted by the store's query
    from ttt_pipeline.evaluation.forecast import Calibration

    threshold = Calibration.from_dict(payload()["calibration"]).atc_threshold
    share = sum((0.7 if i % 4 else 0.95) > threshold for i in range(100)) / 100
    assert s["baselines"]["atc"] == pytest.approx(0.9 - share)
    assert s["skipped_parts"] and s["skipped_parts"][0].endswith("part-crashed.parquet")  # named, not fatal
    assert s["retention_removed"] == [] and s["event"] == {"name": "ttt.traffic.noisy", "id": None}


def test_each_window_is_one_step_of_the_versions_monitoring_run(judged, store):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{store['tmp']}/mlflow.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.ttt_run_kind = 'traffic-monitor'")
    assert len(runs) == 1 and judged["clean"][1]["mlflow_run_id"] == judged["noisy"][1]["mlflow_run_id"] == \
        runs[0].info.run_id
    run = runs[0]
    assert (run.data.tags["registered_model"], run.data.tags["model_version"]) == ("reviews", "3")
    assert run.data.tags["last_verdict"] == "noisy"
    steps = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "forecast_drop")]
    ends = [int(dt.datetime(2024, 5, 1, h, tzinfo=UTC).timestamp()) for h in (9, 10)]
    assert [s for s, _ in steps] == ends and steps[0][1] == 0.0 and steps[1][1] > 0.1
    assert [m.value for m in client.get_metric_history(run.info.run_id, "noisy")] == [0.0, 1.0]
    assert [m.timestamp for m in client.get_metric_history(run.info.run_id, "n")] == [e * 1000 for e in ends]
    assert "traffic_forecast.png" in [a.path for a in client.list_artifacts(run.info.run_id)]


def test_an_empty_window_is_no_traffic_with_rc_0(store, capsys):
    rc, s, text = _monitor(store, capsys, "2024-05-01T12:00:00Z", "--model", "reviews")
    assert rc == 0, text
    assert s["verdict"] == "no_traffic" and s["n"] == 0 and s["mlflow_run_id"] is None
    assert "no_traffic (0 records" in text
    # the configuration's own model (demo's), which sent nothing: no_traffic too
    rc, s, _ = _monitor(store, capsys, "2024-05-01T10:00:00Z")
    assert rc == 0 and s["verdict"] == "no_traffic" and s["model_name"] == "ttt-demo-reviews-negative-positive"


def test_too_few_records_is_no_traffic(store, capsys):
    rc, s, _ = _monitor(store, capsys, "2024-05-01T10:00:00Z", "--model", "other")
    assert rc == 0 and s["verdict"] == "no_traffic" and s["n"] == 10 and s["forecast_drop"] is None


def test_without_a_calibration_the_error_says_how_to_get_one(store, capsys):
    rc, s, text = _monitor(store, capsys, "2024-05-01T10:00:00Z", "--model", "reviews")
    assert rc == 2 and s is None
    assert "error: the model has no forecast calibration" in text and "hint: " in text


def test_a_bad_window_is_a_user_error(store, capsys):
    from ttt_pipeline.cli.main import main

    assert main(["monitor", "--window", "24x"]) == 2
    assert "error: window '24x' is not a duration" in capsys.readouterr().err


def test_retention_drops_old_partitions(store, capsys):
    before = sorted(p.name for p in store["uri"].iterdir())
    assert "date=2000-01-01" in before
    rc, s, _ = _monitor(store, capsys, "2024-05-01T12:00:00Z", "--model", "reviews", "--set",
                        "monitoring.retention_days=30")
    assert rc == 0 and [r.rsplit("/", 1)[-1] for r in s["retention_removed"]] == ["date=2000-01-01"]
    assert sorted(p.name for p in store["uri"].iterdir()) == ["date=2024-05-01"]


def test_a_registered_versions_stored_calibration_is_read(judged, store, capsys):
    """No --calibration: the calibration stored with the version's pipeline run (io.calibration_store), as a
    pipeline run logs it."""
    from ttt_pipeline.io.calibration_store import ARTIFACT
    from ttt_pipeline.io.tracking import Tracker

    tracker = Tracker(f"sqlite:///{store['tmp']}/mlflow.db", "calibrated", str(store["tmp"] / "mlruns"))
    parent = tracker.start("pipeline")
    stored = payload(seed=1)
    tracker.dict(parent, stored, ARTIFACT)
    tracker.client.create_registered_model("registered")
    tracker.client.create_model_version("registered", "file:///nowhere", tags={"parent_run_id": parent})
    rc, s, text = _monitor(store, capsys, "2024-05-01T10:00:00Z", "--model", "registered")
    assert rc == 3, text
    assert s["verdict"] == "noisy" and (s["model_name"], s["model_version"], s["n"]) == ("registered", "1", 60)
    assert s["calibration"]["model"] == stored["calibration"]["model"]
    assert s["calibration"]["held_out_error"] == stored["calibration"]["held_out_errors"][s["calibration"]["model"]]
