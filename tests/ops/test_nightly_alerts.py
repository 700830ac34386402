"""Integration: the nightly alarm reaches a webhook through the shipped automation (scripts/nightly_alerts.py).

A real Prefect server (own PREFECT_HOME in tmp, a free port on 127.0.0.1) and a local HTTP receiver; a tiny
registered champion; `ttt-pipeline reevaluate` twice as separate processes (the command users run): a first night,
then, after a previous night that was right on 10% more reviews, a night that must end in the state "Regression".
The server records the `ttt.nightly.regression` event with its figures, and the automation posts it to the
receiver. Without TTT_ALERT_WEBHOOK_URL the script creates nothing.
"""

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
import yaml
from netutil import free_port, prefect_server
from tiny_config import tiny_config

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NAME = "alerts-tiny-classifier"


def iso_date(year: int, month: int, day: int) -> str:
    """A night as the flow and the CLI take it (YYYY-MM-DD)."""
    return datetime.date(year, month, day).isoformat()
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prefect-alerts")
    with prefect_server(tmp, HF_HUB_OFFLINE="1") as (env, port):
        env.pop("TTT_ALERT_WEBHOOK_URL", None)
        yield {"env": env, "port": port, "tmp": tmp}


@pytest.fixture(scope="module")
def receiver():
    got: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            got.append({"path": self.path, "json": json.loads(body or b"{}")})
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Hook)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield {"url": f"http://127.0.0.1:{httpd.server_address[1]}/ttt-hook", "got": got}
    httpd.shutdown()
    httpd.server_close()


def _script(env: dict, url: str | None) -> str:
    e = dict(env)
    if url:
        e["TTT_ALERT_WEBHOOK_URL"] = url
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "nightly_alerts.py")], env=e, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def _automations(env: dict) -> list:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
        with get_client(sync_client=True) as c:
            return c.read_automations_by_name("ttt-nightly-regression")


def _champion(tmp: Path, tiny_bert_dir: Path) -> dict:
    """A tiny classifier (untrained head) registered at alias `champion`; the config scores the whole demo test
    split (98 reviews) with masked TTT as the recommended defense."""
    from mlflow.tracking import MlflowClient

    from ttt_pipeline.config import PipelineConfig
    from ttt_pipeline.io.tracking import Tracker
    from ttt_pipeline.modeling.model import build_classifier, save_model

    raw = tiny_config(tmp, tiny_bert_dir, suite="ops")
    raw["data"]["max_test_samples"] = None
    raw["registry"] = {"enabled": False, "model_name": NAME}
    raw["evaluation"] = {"default_defense": "masked_ttt"}
    cfg = PipelineConfig.model_validate(raw)
    model, tok = build_classifier(cfg.model, cfg.data.label_names)
    save_model(model, tok, tmp / "model")
    tracker = Tracker.from_config(cfg.tracking)
    run_id = tracker.start("finetune")
    tracker.artifact(run_id, tmp / "model", "model")
    tracker.end(run_id)
    client = MlflowClient(cfg.tracking.tracking_uri)
    client.create_registered_model(NAME)
    mv = client.create_model_version(NAME, f"{client.get_run(run_id).info.artifact_uri}/model", run_id=run_id)
    client.set_registered_model_alias(NAME, "champion", mv.version)
    (tmp / "night.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    return {"cfg": cfg, "client": client, "tracker": tracker, "yaml": tmp / "night.yaml"}


def _reevaluate(env: dict, config: Path, night: str) -> tuple[int, dict, str]:
    p = subprocess.run([str(BIN / "ttt-pipeline"), "reevaluate", "--config", str(config), "--night", night, "--json"],
                       env=env, capture_output=True, text=True, timeout=600, cwd=config.parent)
    return p.returncode, json.loads(p.stdout.strip().splitlines()[-1]), p.stdout + p.stderr


def _better_previous_night(champ: dict, run_id: str, tmp: Path) -> None:
    """A previous night right on 10 more reviews in 100 of the same reference suite (a real regression tonight)."""
    import pandas as pd

    ref = pd.read_parquet(champ["client"].download_artifacts(run_id, "predictions_ref.parquet", str(tmp)))
    wrong = sorted(set(ref.loc[(ref["method"] == "masked_ttt") & (ref["pred"] != ref["label"]), "index"]))
    n = ref["index"].nunique()
    fix = (ref["method"] == "masked_ttt") & ref["index"].isin(wrong[: round(0.1 * n)])
    ref.loc[fix, "pred"] = ref.loc[fix, "label"]
    (tmp / "better").mkdir()
    ref.to_parquet(tmp / "better" / "predictions_ref.parquet", index=False)
    tr = champ["tracker"]
    before = iso_date(2029, 6, 3)
    fake = tr.start(f"nightly-{before}", tags={"ttt_run_kind": "nightly-reevaluation", "night": before,
                                               "registered_model": NAME})
    tr.metrics(fake, {"robust_acc_ref": 0.9})
    tr.artifact(fake, tmp / "better" / "predictions_ref.parquet")
    tr.end(fake)


def _wait_for(fn, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if out := fn():
            return out
        time.sleep(1)
    return None


def test_a_regression_event_reaches_the_webhook_through_the_shipped_automation(server, receiver, tiny_bert_dir,
                                                                              tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter
    from prefect.settings import PREFECT_API_URL, temporary_settings

    env = server["env"]
    assert "nothing will be sent" in _script(env, None) and _automations(env) == []
    assert "every ttt.nightly.regression event is posted" in _script(env, receiver["url"])
    assert len(_automations(env)) == 1
    assert "every ttt.nightly.regression event is posted" in _script(env, receiver["url"])  # re-run: replaced
    assert len(_automations(env)) == 1

    champ = _champion(tmp_path, tiny_bert_dir)
    code, first, log = _reevaluate(env, champ["yaml"], iso_date(2029, 6, 1))
    assert code == 0 and first["verdict"] == "ok" and first["defense"] == "masked_ttt", log[-3000:]
    assert first["event"]["name"] == "ttt.nightly.ok"
    _better_previous_night(champ, first["mlflow_run_id"], tmp_path)
    code, night, log = _reevaluate(env, champ["yaml"], iso_date(2029, 6, 4))
    assert code == 3 and night["verdict"] == "regression", log[-3000:]
    assert night["reference"]["ci_high"] < -0.02 and night["event"]["name"] == "ttt.nightly.regression"

    def recorded():
        with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"]}):
            with get_client(sync_client=True) as c:
                return [e for e in c.read_events(EventFilter(event=EventNameFilter(name=["ttt.nightly.regression"])),
                                                 limit=50).events if str(e.id) == night["event"]["id"]]

    (event,) = _wait_for(recorded)
    assert event.payload["reference"]["delta"] == pytest.approx(night["reference"]["delta"])
    assert event.resource["prefect.resource.id"] == f"ttt.registered-model.{NAME}"
    posts = _wait_for(lambda: list(receiver["got"]))
    assert posts, "the automation did not post to the webhook"
    assert len(posts) == 1 and posts[0]["path"] == "/ttt-hook"  # the ok night sent nothing
    body = posts[0]["json"]
    assert body["source"] == "ttt-pipeline" and NAME in body["subject"] and iso_date(2029, 6, 4) in body["body"]
    assert f"{night['reference']['delta']}"[:6] in body["body"]
