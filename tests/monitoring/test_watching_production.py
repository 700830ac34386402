"""Integration: production watched without labels, end to end on 127.0.0.1.

A tiny champion (the tiny BERT, `spell` as its default defense, the demo reviews' vocabulary) is logged and
registered in a sqlite MLflow store and served by `ttt-pipeline serve --set monitoring.capture=true`; a real
Prefect server (`prefect server start`) takes the events and delivers the alerts `ttt-pipeline alerts apply`
created to a local HTTP receiver through a `CustomWebhookNotificationBlock`. 500 requests: 250 demo reviews, then
the same reviews under heavy keyboard typos. `ttt-pipeline monitor` judges the clean half `ok` (exit 0), the
`traffic-monitor` flow judges the noisy half `noisy` (state "Noisy"); each emits its event, and the noisy one's
alert arrives.

The calibration is fitted here on the served model's own descriptors of corrupted copies of the reviews (their
repaired-word share, confidences and label shares, measured by the capture's own code), each set's drop set by
a fixed dose-response (DROP_PER_REPAIRED_WORD): the tiny untrained model has no accuracy to lose, so a measured drop
would be noise. What is under test is the path from a request to an alert, not the forecast's accuracy.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from netutil import free_port, listening, prefect_server

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
NAME = "ttt-watched-review-classifier"
LABELS = ["negative", "positive"]
N_HALF = 250
DROP_PER_REPAIRED_WORD = 0.5
FAMILIES = ("keyboard", "char_drop", "ocr", "misspelling")


def _reviews() -> list[str]:
    rows = [json.loads(line) for line in (REPO / "data" / "demo" / "reviews.jsonl").read_text().splitlines()]
    return [r["text"] for r in rows]


@pytest.fixture(scope="module")
def receiver():
    got: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            got.append(json.loads(body or b"{}"))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield {"url": f"http://127.0.0.1:{httpd.server_address[1]}/hook", "got": got}
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def prefect(tmp_path_factory):
    with prefect_server(tmp_path_factory.mktemp("prefect-watch")) as (env, _):
        yield env


@pytest.fixture(scope="module")
def champion(tmp_path_factory, make_tiny_clf):
    """The tiny classifier logged as a pipeline run's fine-tune output and registered as v1, the champion."""
    from mlflow.tracking import MlflowClient

    from ttt_pipeline.defenses.vocabulary import training_vocabulary
    from ttt_pipeline.io.mlflow_model import log_classifier_model
    from ttt_pipeline.io.model_registry import register_run
    from ttt_pipeline.modeling.model import save_model

    tmp = tmp_path_factory.mktemp("watched")
    uri = f"sqlite:///{tmp}/mlflow.db"
    model, tok = make_tiny_clf(LABELS, head_dropout=0.0)
    folder = save_model(model, tok, tmp / "model" / "model")
    client = MlflowClient(uri, registry_uri=uri)
    experiment = client.create_experiment("watching", artifact_location=(tmp / "mlruns").as_uri())
    parent = client.create_run(experiment, run_name="pipeline")
    child = client.create_run(experiment, run_name="fine-tune",
                              tags={"mlflow.parentRunId": parent.info.run_id, "stage": "finetune"})
    log_classifier_model(client, child.info.run_id, folder, {"method": "spell"}, training_vocabulary(_reviews()))
    for run in (child, parent):
        client.set_terminated(run.info.run_id)
    result = register_run(client, parent.info.run_id, NAME, "acc_ttt", 0.5, LABELS)
    assert result.decision == "promoted" and result.version == "1"
    return {"tmp": tmp, "uri": uri, "folder": folder}


def _calibration(champion) -> Path:
    """The payload the calibration store would hold, fitted on corrupted copies of the reviews (module doc)."""
    from ttt_pipeline.corruption import corrupt_texts
    from ttt_pipeline.evaluation.descriptors import text_descriptors, training_scripts, window_descriptors
    from ttt_pipeline.evaluation.forecast import CalibrationPoint, CleanReference, fit_calibration
    from ttt_pipeline.io.mlflow_model import load_classifier

    clf = load_classifier(f"models:/{NAME}/1", device="cpu", tracking_uri=champion["uri"])
    vocab, scripts = frozenset(clf.vocabulary), training_scripts(clf.vocabulary)
    texts = _reviews()[N_HALF:N_HALF + 120]  # reviews the traffic does not send

    def window(batch):
        probs = clf.predict_proba(batch, "spell")
        return window_descriptors(text_descriptors(batch, clf.repair_texts(batch, "spell"), vocab, scripts), probs)

    clean = window(texts)
    points = []
    for f, family in enumerate(FAMILIES):
        for severity in (1, 3, 5):
            w = window(corrupt_texts(texts, family, severity, seed=7).texts)
            excess = w["repaired_words_share"] - clean["repaired_words_share"]
            drop = DROP_PER_REPAIRED_WORD * max(excess, 0.0) * (1 + 0.05 * (f - 1.5))
            points.append(CalibrationPoint(family, severity, w, accuracy=0.9 - drop, drop=drop))
    confidences = clf.predict_proba(texts, "spell").max(axis=1)
    cal = fit_calibration(points, CleanReference(clean, 0.9, confidences))
    path = champion["tmp"] / "calibration.json"
    path.write_text(json.dumps({"calibration": cal.to_dict(), "reference": {
        **{k: v for k, v in clean.items() if k != "label_shares"}, "label_shares": clean["label_shares"],
        "label_names": clf.label_names, "test_accuracy": 0.9, "n": len(texts)}, "sets": []}))
    return path


@pytest.fixture(scope="module")
def served(champion, prefect):
    port = free_port()
    log = champion["tmp"] / "serve.log"
    env = {**prefect, "HF_HUB_OFFLINE": "1", "TTT_DEVICE": "cpu", "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    for var in ("TTT_TRACKING_URI", "MLFLOW_TRACKING_URI", "PYTHONPATH"):
        env.pop(var, None)
    traffic = champion["tmp"] / "traffic"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(BIN / "ttt-pipeline"), "serve", "--model", NAME, "--tracking-uri",
                                 champion["uri"], "--port", str(port), "--follow", "off",
                                 "--log-dir", str(champion["tmp"] / "serve-logs"),
                                 "--set", "monitoring.capture=true", "--set", f"monitoring.traffic_uri={traffic}"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2):
                    break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail(f"serve did not answer: {log.read_text()[-4000:]}")
        yield {"url": f"http://127.0.0.1:{port}", "traffic": traffic, "log": log, "env": env}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
        assert not listening(port)
        print(log.read_text()[-2000:])


def _ask(url: str, text: str) -> str:
    req = urllib.request.Request(f"{url}/invocations", data=json.dumps({"inputs": [text]}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["predictions"][0]["label"]


def _send(url: str, texts: list[str]) -> tuple[dt.datetime, dt.datetime]:
    """Every text as its own request, two clients at once; (before the first, after the last) in UTC."""
    start = dt.datetime.now(dt.timezone.utc)
    with ThreadPoolExecutor(2) as pool:
        labels = list(pool.map(lambda t: _ask(url, t), texts))
    assert len(labels) == len(texts) and set(labels) <= set(LABELS)
    return start, dt.datetime.now(dt.timezone.utc)


def _wait_recorded(traffic: Path, start: dt.datetime, end: dt.datetime, n: int) -> int:
    from ttt_pipeline.io.traffic_window import read_window

    deadline = time.monotonic() + 90  # the writer flushes every 5 s
    got = 0
    while time.monotonic() < deadline:
        got = read_window(traffic, start, end, model_name=NAME)["n"]
        if got >= n:
            return got
        time.sleep(1)
    return got


def _window(start: dt.datetime, end: dt.datetime) -> str:
    return f"{math.ceil((end - start).total_seconds())}s"


def test_clean_traffic_is_ok_noisy_traffic_alerts(champion, prefect, served, receiver):
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.events.worker import EventsWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from ttt_pipeline.config import load_config
    from ttt_pipeline.corruption import corrupt_texts
    from ttt_pipeline.flows.monitor import traffic_monitor

    url = prefect["PREFECT_API_URL"]
    with temporary_settings(updates={PREFECT_API_URL: url}):
        CustomWebhookNotificationBlock(name="ttt-alerts", url=receiver["url"], method="POST",
                                       json_data={"subject": "{{subject}}", "body": "{{body}}"}).save(
            "ttt-alerts", overwrite=True)
    applied = subprocess.run([str(BIN / "ttt-pipeline"), "alerts", "apply", "--block", "custom-webhook/ttt-alerts"],
                             env=served["env"], capture_output=True, text=True, timeout=180)
    assert applied.returncode == 0 and "automation ttt-traffic-noisy" in applied.stdout, applied.stderr
    calibration = _calibration(champion)

    texts = _reviews()[:N_HALF]
    clean_start, clean_end = _send(served["url"], texts)
    time.sleep(2.5)  # a gap, so the windows of whole seconds below hold one half each
    noisy_start, noisy_end = _send(served["url"], corrupt_texts(texts, "keyboard", 5, seed=3).texts)
    assert _wait_recorded(served["traffic"], clean_start, noisy_end, 2 * N_HALF) == 2 * N_HALF
    sets = ["--set", f"monitoring.traffic_uri={served['traffic']}", "--set", f"tracking.tracking_uri={champion['uri']}",
            "--set", f"tracking.artifact_root={champion['tmp'] / 'mlruns'}"]

    clean_window = _window(clean_start, clean_end)
    ok = subprocess.run([str(BIN / "ttt-pipeline"), "monitor", "--model", NAME, "--window", clean_window, "--end",
                         clean_end.isoformat(), "--calibration", str(calibration), "--json", *sets],
                        env=served["env"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    s_ok = json.loads(ok.stdout.strip().splitlines()[-1])
    assert s_ok["verdict"] == "ok" and s_ok["n"] == N_HALF and s_ok["model_version"] == "1"
    assert s_ok["event"]["name"] == "ttt.traffic.ok" and s_ok["event"]["id"]

    cfg = load_config("demo", [s for s in sets if s != "--set"])
    with temporary_settings(updates={PREFECT_API_URL: url}):
        state = traffic_monitor(config=cfg, window=_window(noisy_start, noisy_end), end=noisy_end.isoformat(),
                                model_name=NAME, calibration=str(calibration), return_state=True)
        EventsWorker.drain_all(timeout=30)
    assert state.name == "Noisy" and state.is_completed(), state
    s_noisy = state.result()
    assert s_noisy["verdict"] == "noisy" and s_noisy["n"] == N_HALF and s_noisy["event"]["id"]
    assert s_noisy["descriptors"]["repaired_words_share"] > s_ok["descriptors"]["repaired_words_share"] + 0.1
    assert s_noisy["forecast_drop"]["ci_low"] > cfg.monitoring.max_drop >= s_ok["forecast_drop"]["ci_low"]
    assert s_noisy["mlflow_run_id"] == s_ok["mlflow_run_id"]  # one monitoring run per version, two steps

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not any("noisy traffic" in g.get("subject", "") for g in receiver["got"]):
        time.sleep(0.5)
    alerts = [g for g in receiver["got"] if "noisy traffic" in g.get("subject", "")]
    assert [a["subject"] for a in alerts] == [f"ttt-pipeline: noisy traffic for {NAME} v1"], receiver["got"]
    assert f"{N_HALF} requests to {NAME} v1" in alerts[0]["body"] and s_noisy["mlflow_run_id"] in alerts[0]["body"]
    assert not [g for g in receiver["got"] if "traffic" in g.get("subject", "") and g not in alerts]  # ok: silent
    print(f"clean: {s_ok['forecast_drop']}; noisy: {s_noisy['forecast_drop']}; "
          f"{(noisy_end - clean_start).total_seconds():.0f} s of requests")
    assert np.isfinite(s_noisy["baselines"]["ac"]) and s_noisy["baselines"]["atc"] is not None
