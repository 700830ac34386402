"""The champion's moves without servers: the event a promotion emits (and only a promotion), `ttt-pipeline promote`
on a sqlite registry, and the serving front's switch (a request in flight on the old back end finishes there)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ttt_pipeline import events as champion
from ttt_pipeline.errors import PipelineError
from ttt_pipeline.io import serving


@pytest.fixture()
def emitted(monkeypatch):
    import prefect.events

    sent = []

    def fake_emit(**kwargs):
        sent.append(kwargs)

    monkeypatch.setattr(prefect.events, "emit_event", fake_emit)
    return sent


def test_a_promotion_emits_the_event_naming_model_version_and_metric(emitted):
    decision = {"model_name": "ttt-x-a-b", "version": "3", "decision": "promoted", "metric": "acc_default",
                "candidate_value": 0.71, "champion_before": "2", "reason": "0.71 > champion v2 0.70"}
    champion.emit_promoted(decision)
    [event] = emitted
    assert event["event"] == champion.EVENT == "ttt.champion.promoted"
    assert event["resource"] == {"prefect.resource.id": "ttt.registered-model.ttt-x-a-b",
                                 "prefect.resource.name": "ttt-x-a-b"}
    assert event["payload"] == {"model_name": "ttt-x-a-b", "version": "3", "metric": "acc_default", "value": 0.71,
                                "champion_before": "2", "reason": "0.71 > champion v2 0.70"}
    for other in ({**decision, "decision": "kept"}, {**decision, "decision": "skipped", "version": None}):
        assert champion.emit_promoted(other) is None
    assert len(emitted) == 1


def test_promote_by_hand_moves_the_alias_and_emits(tmp_path, emitted, monkeypatch):
    from mlflow.tracking import MlflowClient

    from ttt_pipeline.cli.main import main

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri, registry_uri=uri)
    client.create_registered_model("m")
    for i in (1, 2):
        (tmp_path / f"v{i}").mkdir()
        client.create_model_version("m", str(tmp_path / f"v{i}"), tags={"metric": "acc_default"})
    client.set_registered_model_alias("m", "champion", "2")
    monkeypatch.setattr(champion, "flush_events", lambda timeout=10.0: None)
    assert main(["promote", "--model", "m", "--version", "1", "--tracking-uri", uri]) == 0
    assert str(client.get_model_version_by_alias("m", "champion").version) == "1"
    assert client.get_model_version("m", "1").tags["decision_reason"] == "set by hand (was v2)"
    [event] = emitted
    assert event["payload"]["version"] == "1" and event["payload"]["champion_before"] == "2"
    with pytest.raises(PipelineError, match="has no version 9"):
        champion.promote_by_hand(uri, "m", "9")


def _fake_backend(version: str, delay: float, log_dir: Path) -> tuple[serving.Backend, ThreadingHTTPServer]:
    """An HTTP server answering {"version": ...} after `delay` s, and a Backend whose process is a `sleep`."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            time.sleep(delay)
            body = json.dumps({"version": version}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    return serving.Backend(version, http.server_address[1], proc, log_dir / f"{version}.log"), http


def test_the_front_switches_and_the_old_back_end_finishes_its_request_first(tmp_path):
    old, old_http = _fake_backend("1", 1.5, tmp_path)
    new, new_http = _fake_backend("2", 0.0, tmp_path)
    front = serving.Front("127.0.0.1", 0, old)
    threading.Thread(target=front.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{front.server_address[1]}/invocations"

    def ask():
        req = urllib.request.Request(url, data=b"{}", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.headers[serving.VERSION_HEADER], json.loads(r.read())["version"]

    slow = {}
    t = threading.Thread(target=lambda: slow.update(answer=ask()))
    t.start()
    time.sleep(0.5)  # the slow request is on the old back end now
    assert front.switch(new) is old
    assert ask() == ("2", "2")
    stop = threading.Thread(target=serving.stop_backend, args=(old,))
    stop.start()
    t.join(10)
    stop.join(10)
    assert slow["answer"] == ("1", "1")  # finished where it started, before its back end was stopped
    assert old.proc.poll() is not None and new.proc.poll() is None
    front.shutdown()
    serving.stop_backend(new, drain_s=0)
    for h in (old_http, new_http):
        h.shutdown()


def test_check_switches_when_the_alias_moves_and_keeps_serving_when_the_new_version_fails(tmp_path, monkeypatch):
    """ChampionServer.check on the registry's alias (what polling calls): a move starts, readies and switches to
    the new version and stops the old; a version whose server never answers is left alone, the old one serving."""
    versions = {"alias": "1"}
    started, stopped = [], []

    class Client:
        def get_model_version_by_alias(self, name, alias):
            return type("MV", (), {"version": versions["alias"]})()

    def start(name, version, uri, log_dir, bin_dir=None, monitoring=None, workers=1):
        started.append(version)
        return serving.Backend(version, 0, None, tmp_path / f"{version}.log")

    monkeypatch.setattr(serving, "start_backend", start)
    monkeypatch.setattr(serving, "wait_ready", lambda backend, timeout_s: backend.version != "3")
    monkeypatch.setattr(serving, "stop_backend", lambda backend, drain_s=120.0: stopped.append(backend.version))
    monkeypatch.setattr(serving, "Front", lambda host, port, backend: type("F", (), {
        "backend": backend, "serve_forever": lambda self: None,
        "switch": lambda self, new: (self.backend, setattr(self, "backend", new))[0]})())
    server = serving.ChampionServer(Client(), "m", "sqlite:///x.db", tmp_path)
    server.start("127.0.0.1", 0)
    assert server.check() is None and started == ["1"]  # nothing moved
    versions["alias"] = "2"
    assert server.check() == "2" and server.front.backend.version == "2" and stopped == ["1"]
    versions["alias"] = "3"  # its server never answers
    assert server.check() is None and server.front.backend.version == "2" and stopped == ["1", "3"]
    assert server.check() is None and started == ["1", "2", "3"]  # not retried until the alias moves again
