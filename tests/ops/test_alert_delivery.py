"""Integration: the alerts `ttt-pipeline alerts apply` creates reach a receiver through a Prefect notification block.

A real Prefect server (`prefect server start`, own PREFECT_HOME, a free port on 127.0.0.1: its triggers and actions
services do the sending) and a local HTTP receiver saved as a `CustomWebhookNotificationBlock`. The automations are
applied by the command users run, with the missed-night window shortened to seconds. Then: a regression verdict
(the event the nightly's own task emits), a nightly deployment run that fails (the real flow, a preset that does
not exist), and no verdict for longer than the window: each arrives at the receiver as its own notification."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from netutil import prefect_server

BIN = Path(sys.executable).parent
NAME = "ttt-alerts-test-model"
MISSED_HOURS = "0.006"  # the test's missed-night window: 21.6 s
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prefect-delivery")
    with prefect_server(tmp) as (env, _):
        yield {"env": env, "url": env["PREFECT_API_URL"], "tmp": tmp}


@pytest.fixture(scope="module")
def receiver():
    got: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            got.append({"at": time.monotonic(), **json.loads(body or b"{}")})
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield {"url": f"http://127.0.0.1:{httpd.server_address[1]}/hook", "got": got}
    httpd.shutdown()
    httpd.server_close()


def _wait_for(fn, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if out := fn():
            return out
        time.sleep(0.5)
    return None


def _failing_nightly_deployment_run(api_url: str):
    """A run of the real nightly flow from a deployment named as prefect.yaml names it, run in this process as a
    worker would run it, with a preset that does not exist: it ends Failed before any verdict."""
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from ttt_pipeline.flows.reevaluate import nightly_reevaluation

    params = {"preset": "no-such-preset"}
    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        deployment_id = nightly_reevaluation.to_deployment(name="nightly-reevaluation").apply()
        with get_client(sync_client=True) as client:
            flow_run = client.create_flow_run_from_deployment(deployment_id, parameters=params)
        state = run_flow(nightly_reevaluation, flow_run=flow_run, parameters=params, return_type="state")
    return flow_run, state


def test_regression_failed_run_and_missed_night_reach_the_receiver(server, receiver):
    from prefect.blocks.notifications import CustomWebhookNotificationBlock
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from ttt_pipeline.events import emit_outcome

    with temporary_settings(updates={PREFECT_API_URL: server["url"]}):
        CustomWebhookNotificationBlock(name="ttt-alerts", url=receiver["url"], method="POST",
                                       json_data={"subject": "{{subject}}", "body": "{{body}}"}).save(
            "ttt-alerts", overwrite=True)
    applied = subprocess.run([str(BIN / "ttt-pipeline"), "alerts", "apply", "--block", "custom-webhook/ttt-alerts",
                              "--missed-after", MISSED_HOURS], env=server["env"], capture_output=True,
                             text=True, timeout=180)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert applied.stdout.count("notifies custom-webhook/ttt-alerts") == 5  # the nightly's four, noisy traffic
    t_applied = time.monotonic()

    def subjects(word):
        return [g for g in receiver["got"] if word in g["subject"]]

    night = datetime.date(2029, 6, 4)  # the nightly names each night by its ISO date
    with temporary_settings(updates={PREFECT_API_URL: server["url"]}):
        emit_outcome("regression", NAME, {
            "model_name": NAME, "model_version": "3", "defense": "masked_ttt", "night": night.isoformat(),
            "reference": {"delta": -0.1, "ci_low": -0.16, "ci_high": -0.05,
                          "against": (night - datetime.timedelta(days=1)).isoformat()},
            "mlflow_run_id": "0" * 32})
        from prefect.events.worker import EventsWorker

        EventsWorker.drain_all(timeout=30)
    [regression] = _wait_for(lambda: subjects("regression"), 60) or pytest.fail(f"no regression: {receiver['got']}")
    assert NAME in regression["subject"] and "-0.1 [-0.16," in regression["body"] and night.isoformat() in regression["body"]

    flow_run, state = _failing_nightly_deployment_run(server["url"])
    assert state.is_failed(), state
    failed = _wait_for(lambda: subjects("nightly run"), 60) or pytest.fail(f"no failure: {receiver['got']}")
    assert [f["subject"] for f in failed] == [f"ttt-pipeline: nightly run {flow_run.name} Failed"]
    assert "no-such-preset" in failed[0]["body"] and str(flow_run.id) in failed[0]["body"]

    missed = _wait_for(lambda: subjects("no nightly re-evaluation"), 90) or pytest.fail(
        f"no missed-night alert: {receiver['got']}")
    assert missed[0]["subject"] == f"ttt-pipeline: no nightly re-evaluation in {MISSED_HOURS} hours"
    assert missed[0]["at"] - t_applied >= 21  # not before the window has passed without a verdict
    print(f"received {len(receiver['got'])}: " + "; ".join(g["subject"] for g in receiver["got"]))
