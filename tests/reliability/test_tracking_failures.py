"""Tracking failures: a transient MLflow error is retried with backoff, a persistent one is raised (never
swallowed), no metric goes missing without a warning, and a dead server fails the start check in seconds."""

from __future__ import annotations

import logging
import os
import socket
import time

import pytest

from ttt_pipeline.errors import PipelineError
from ttt_pipeline.io import tracking
from ttt_pipeline.io.tracking import Tracker, retry


class FlakyClient:
    """log_batch fails `failures` times (as a server blip or a locked sqlite would), then records."""

    def __init__(self, failures: int):
        self.failures = failures
        self.calls = 0
        self.metrics: list = []
        self.params: list = []

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("connection reset by peer")
        self.metrics += list(metrics)
        self.params += list(params)


@pytest.fixture()
def tracker(monkeypatch):
    t = Tracker("http://127.0.0.1:1", "reliability")  # an http client connects lazily; the fakes replace it
    t._experiment_id = "0"
    sleeps: list[float] = []
    monkeypatch.setattr(tracking.time, "sleep", sleeps.append)
    t.sleeps = sleeps
    return t


def test_transient_failure_is_retried_with_backoff_and_nothing_is_lost(tracker, caplog):
    tracker.client = FlakyClient(failures=2)
    with caplog.at_level(logging.WARNING, logger="ttt_pipeline.io.tracking"):
        tracker.metrics("run", {"acc_clean": 0.75, "acc_ttt": 0.8, "n": 3})
    assert tracker.sleeps == [0.5, 1.0]  # exponential backoff
    assert sorted(m.key for m in tracker.client.metrics) == ["acc_clean", "acc_ttt", "n"]
    assert sum("retrying" in r.getMessage() for r in caplog.records) == 2


def test_persistent_failure_is_raised_not_swallowed(tracker):
    tracker.client = FlakyClient(failures=99)
    with pytest.raises(ConnectionError):
        tracker.metrics("run", {"acc_clean": 0.75})
    assert tracker.client.calls == 4 and tracker.sleeps == [0.5, 1.0, 2.0]


def test_retry_returns_the_value_and_keeps_the_last_error():
    outcomes = iter([TimeoutError("1"), ValueError("2"), "ok"])

    def fn():
        v = next(outcomes)
        if isinstance(v, Exception):
            raise v
        return v

    assert retry(fn, "thing", attempts=3, base_delay=0) == "ok"
    with pytest.raises(KeyError, match="last"):
        retry(lambda: (_ for _ in ()).throw(KeyError("last")), "thing", attempts=2, base_delay=0)


def test_large_batches_are_chunked_and_all_arrive(tracker):
    tracker.client = FlakyClient(failures=1)
    metrics = {f"acc/{i}": i / 2000 for i in range(2000)}
    tracker.metrics("run", metrics)
    assert len(tracker.client.metrics) == 2000


def test_nan_metrics_are_not_dropped_silently(tracker, caplog):
    tracker.client = FlakyClient(failures=0)
    with caplog.at_level(logging.WARNING, logger="ttt_pipeline.io.tracking"):
        tracker.metrics("run", {"ok": 1.0, "bad": float("nan"), "text": "x", "absent": None})
    assert [m.key for m in tracker.client.metrics] == ["ok"]
    warned = [r.getMessage() for r in caplog.records if "not logged" in r.getMessage()]
    assert warned and "bad" in warned[0] and "text" in warned[0] and "absent" not in warned[0]


def test_dead_server_fails_the_check_in_seconds_and_env_is_restored(monkeypatch):
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    t = Tracker(f"http://127.0.0.1:{port}", "reliability")
    t0 = time.perf_counter()
    with pytest.raises(PipelineError) as exc:
        t.check()
    assert time.perf_counter() - t0 < 10
    assert f"http://127.0.0.1:{port}" in exc.value.message and "make servers" in exc.value.hint
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ  # the fast settings were only for the check
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ


def test_user_set_http_retries_are_respected(monkeypatch):
    seen = {}
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")

    class Probe:
        def get_experiment_by_name(self, name):
            seen["retries"] = os.environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES")
            seen["timeout"] = os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT")
            return type("Exp", (), {"experiment_id": "7"})()

    t = Tracker("http://127.0.0.1:1", "reliability")
    t.client = Probe()
    t.check()
    assert seen == {"retries": "3", "timeout": "5"} and t.experiment_id == "7"


def test_the_environment_overrides_the_configured_tracking_uri(monkeypatch, tmp_path):
    """$TTT_TRACKING_URI, else MLflow's own $MLFLOW_TRACKING_URI (what `source .run/env` exports), wins over
    tracking.tracking_uri; with neither set, the config's URI is used (a relative sqlite path made absolute)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TTT_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert Tracker("http://configured:5000", "e").uri == "http://configured:5000"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert Tracker("sqlite:///mlflow.db", "e").uri == "http://127.0.0.1:5999"
    assert not (tmp_path / "mlflow.db").exists()  # the configured store is never opened
    monkeypatch.setenv("TTT_TRACKING_URI", "http://127.0.0.1:5998")
    assert Tracker("sqlite:///mlflow.db", "e").uri == "http://127.0.0.1:5998"  # the project's own variable first
    monkeypatch.setenv("TTT_TRACKING_URI", "  ")  # blank counts as unset
    assert Tracker("sqlite:///mlflow.db", "e").uri == "http://127.0.0.1:5999"
