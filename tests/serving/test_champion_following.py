"""Acceptance: `ttt-pipeline serve` follows the champion. A real Prefect server (Prefect's test harness: a
`prefect server` process on 127.0.0.1) and a real MLflow server on 127.0.0.1; two tiny models are logged as two
pipeline runs' fine-tune outputs (no training: two seeds of the tiny classifier) and registered by the pipeline's
own registry task, so the second promotion emits `ttt.champion.promoted` as a pipeline run would. The server picks
the event up and answers from the new version, while a client looping requests sees no failure. How long the
switch takes is how long the new version's server takes to start beside the old one on a machine that another test
worker loads too: the test allows SWITCH_S and prints the figure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from netutil import free_port, listening
from serving_helpers import LABELS, TEXTS

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent
NAME = "followed-review-classifier"
SWITCH_S = 180


def _wait(url: str, seconds: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{proc.args[:3]} ended: {log.read_text()[-4000:] if log else ''}")
        time.sleep(0.5)
    pytest.fail(f"{url} did not answer within {seconds:.0f} s: {log.read_text()[-4000:] if log else ''}")


def _stop(proc: subprocess.Popen, port: int) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    deadline = time.monotonic() + 20
    while listening(port) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not listening(port), f"port {port} still listening"


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    log = tmp / "mlflow.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
                                 "--backend-store-uri", f"sqlite:///{tmp}/mlflow.db",
                                 "--artifacts-destination", str(tmp / "artifacts"), "--workers", "1"],
                                env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait(f"http://127.0.0.1:{port}/health", 180, proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc, port)


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    import prefect.settings
    from prefect.testing.utilities import prefect_test_harness

    tmp = tmp_path_factory.mktemp("prefect")
    with prefect.settings.temporary_settings(
            updates={prefect.settings.PREFECT_RESULTS_LOCAL_STORAGE_PATH: str(tmp / "prefect-results")}):
        with prefect_test_harness(server_startup_timeout=180):
            yield prefect.settings.PREFECT_API_URL.value()


def _pipeline_run(client, experiment_id: str, folder: Path, value: float) -> str:
    """A pipeline run as the registry finds one: a parent run with the metric, a fine-tune child with the model."""
    from ttt_pipeline.io.mlflow_model import log_classifier_model

    parent = client.create_run(experiment_id, run_name="pipeline")
    client.log_metric(parent.info.run_id, "acc_ttt", value)
    child = client.create_run(experiment_id, run_name="finetune",
                              tags={"mlflow.parentRunId": parent.info.run_id, "stage": "finetune"})
    log_classifier_model(client, child.info.run_id, folder, {"method": "none"})
    for run in (child, parent):
        client.set_terminated(run.info.run_id)
    return parent.info.run_id


@pytest.fixture(scope="module")
def registered(tmp_path_factory, make_tiny_clf, mlflow_server, prefect_api):
    """Two logged models (different seeds, so different answers); the first registered as the champion."""
    from mlflow.tracking import MlflowClient
    from tiny_config import tiny_config

    from ttt_pipeline.config import PipelineConfig
    from ttt_pipeline.modeling.model import save_model
    from ttt_pipeline.tasks.model_registry import register_task

    tmp = tmp_path_factory.mktemp("champion")
    client = MlflowClient(mlflow_server)
    experiment_id = client.create_experiment("champion-following")
    runs = []
    for seed, value in ((0, 0.5), (1, 0.6)):
        model, tok = make_tiny_clf(LABELS, head_dropout=0.0, seed=seed)
        folder = save_model(model, tok, tmp / f"model-{seed}" / "model")
        runs.append(_pipeline_run(client, experiment_id, folder, value))
    cfg = PipelineConfig.model_validate(tiny_config(tmp, tmp, "champion-following", tracking_uri=mlflow_server,
                                                    registry={"model_name": NAME, "metric": "acc_ttt"}))
    first = register_task(cfg, runs[0], {"acc_ttt": 0.5}, LABELS)
    assert first["decision"] == "promoted" and first["version"] == "1"
    return {"tmp": tmp, "cfg": cfg, "runs": runs, "uri": mlflow_server, "prefect": prefect_api,
            "register": lambda: register_task(cfg, runs[1], {"acc_ttt": 0.6}, LABELS)}


@pytest.fixture(scope="module")
def serve(registered):
    port = free_port()
    log = registered["tmp"] / "serve.log"
    env = {**os.environ, "PREFECT_API_URL": registered["prefect"], "HF_HUB_OFFLINE": "1", "TTT_DEVICE": "cpu",
           "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    for var in ("TTT_TRACKING_URI", "MLFLOW_TRACKING_URI", "PYTHONPATH"):
        env.pop(var, None)
    with open(log, "w") as out:
        proc = subprocess.Popen([str(BIN / "ttt-pipeline"), "serve", "--model", NAME, "--tracking-uri",
                                 registered["uri"], "--port", str(port), "--follow", "events",
                                 "--log-dir", str(registered["tmp"] / "serve-logs")],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait(f"http://127.0.0.1:{port}/ping", 300, proc, log)
        yield {"url": f"http://127.0.0.1:{port}", "proc": proc, "log": log, "port": port}
    finally:
        _stop(proc, port)
        print(log.read_text()[-3000:])


def _ask(url: str) -> tuple[str, list]:
    req = urllib.request.Request(f"{url}/invocations", data=json.dumps({"inputs": TEXTS[:2]}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.headers["X-Model-Version"], json.loads(r.read())["predictions"]


def test_serve_switches_to_the_new_champion_without_a_failed_request(serve, registered):
    answers, failures, stop = [], [], threading.Event()

    def loop():
        while not stop.is_set():
            try:
                answers.append((time.monotonic(), *_ask(serve["url"])))
            except Exception as exc:  # any failure at all is what this test is about
                failures.append(repr(exc))
            time.sleep(0.05)  # a steady client, not one that takes the CPU the new version's server starts on

    assert _ask(serve["url"])[0] == "1"
    client = threading.Thread(target=loop)
    client.start()
    try:
        promoted = registered["register"]()
        t0 = time.monotonic()
        assert promoted["decision"] == "promoted" and promoted["version"] == "2"
        while time.monotonic() - t0 < SWITCH_S and not (answers and answers[-1][1] == "2"):
            time.sleep(0.5)
        time.sleep(2)  # a few requests more on the new version
    finally:
        stop.set()
        client.join(150)
    versions = [v for _, v, _ in answers]
    assert not failures, failures[:5]
    assert versions[-1] == "2", (f"still v{versions[-1]} {SWITCH_S} s after the promotion:\n"
                                 f"{serve['log'].read_text()[-3000:]}")
    assert versions == sorted(versions) and "1" in versions  # served v1 until the switch, v2 from then on
    switched = next(t for t, v, _ in answers if v == "2") - t0
    by_version = {v: p for _, v, p in answers}
    assert by_version["1"] != by_version["2"]  # another model answers, not only another label
    print(f"switched {switched:.1f} s after the promotion; {len(answers)} requests, none failed")
    log = serve["log"].read_text()
    assert "follows the champion: events" in log and "switched" in log and "stopped v1" in log
