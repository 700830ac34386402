"""The traffic monitor's alert (ttt_pipeline/flows/traffic_automations.yaml, applied by `ttt-pipeline alerts
apply`): it validates as Prefect's server stores it, fires on `ttt.traffic.noisy` only, and its text reads the
fields the monitor's event carries, rendered as Prefect renders it."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest
import yaml
from monitoring_helpers import calibration, payload

from ttt_pipeline import monitoring
from ttt_pipeline.cli import alerts
from ttt_pipeline.events import TRAFFIC, resource_id

BLOCK = uuid.uuid4()


@pytest.fixture(scope="module")
def noisy():
    return {a.name: a for a in alerts.automations(BLOCK)}["ttt-traffic-noisy"]


def _event(name: str, model: str = "ttt-demo-reviews-negative-positive", event_payload: dict | None = None):
    from prefect.server.events.schemas.events import ReceivedEvent

    now = datetime.now(timezone.utc)
    return ReceivedEvent(occurred=now, received=now, event=name, payload=event_payload or {}, id=uuid.uuid4(),
                         resource={"prefect.resource.id": resource_id(model), "prefect.resource.name": model})


def test_applied_with_the_nightlys_and_removed_with_them(noisy):
    from prefect.server.events.schemas.automations import AutomationCore as ServerAutomationCore

    assert "ttt-traffic-noisy" in alerts.names() and alerts.names()[-1] == "ttt-traffic-noisy"
    ServerAutomationCore.model_validate(noisy.model_dump(mode="json"))
    (action,) = noisy.actions
    assert action.type == "send-notification" and action.block_document_id == BLOCK
    raw = yaml.safe_load(alerts.automations_text("traffic_automations.yaml"))["automations"]
    assert [a["block_document_id"] for item in raw for a in item["actions"]] == [alerts.PLACEHOLDER]


def test_it_fires_on_a_noisy_window_only(noisy):
    from prefect.server.events.schemas.automations import EventTrigger

    trigger = EventTrigger.model_validate(noisy.trigger.model_dump(mode="json"))
    assert trigger.posture == "Reactive" and trigger.immediate
    assert trigger.covers(_event(TRAFFIC["noisy"]))
    assert trigger.covers(_event(TRAFFIC["noisy"], model="my-own-classifier"))
    for other in (TRAFFIC["ok"], TRAFFIC["no_traffic"], "ttt.nightly.regression"):
        assert not trigger.covers(_event(other)), other


def _summary() -> dict:
    cal = calibration()
    bounds = monitoring.window_bounds("1h", "2024-05-01T10:00:00Z")
    n = 200
    means = {"text_length": 80.0, "word_count": 15.0, "oov_words_share": 0.05, "repaired_words_share": 0.2,
             "non_letter_character_share": 0.04, "foreign_script_share": 0.0}
    read = {"n": n, "sums": {k: v * n for k, v in means.items()}, "mean_probability": 0.8, "truncated": 0,
            "labels": {"neg": 100, "pos": 100}, "raw_label_changed": 5, "skipped_parts": []}
    window = monitoring.window_descriptors(read, ["neg", "pos"], payload()["reference"])
    judged = monitoring.judge(cal, window, 0.03, 50)
    s = monitoring.summary(judged=judged, window=window, model_name="reviews", model_version="3", other_versions={},
                           bounds=bounds, duration="1h", max_drop=0.03, min_records=50, read=read, calibration=cal,
                           traffic_uri="traffic")
    return {**s, "mlflow_run_id": "a" * 32}


def test_its_text_reads_what_the_event_carries(noisy):
    """Rendered with Jinja, as the server renders a notification's templates, undefined names failing loudly."""
    import jinja2

    s = _summary()
    assert s["verdict"] == "noisy"
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    event = {"payload": monitoring.event_payload(s)}
    (action,) = noisy.actions
    subject = env.from_string(action.subject).render(event=event)
    body = env.from_string(action.body).render(event=event)
    assert subject == "ttt-pipeline: noisy traffic for reviews v3"
    assert "200 requests to reviews v3" in body and monitoring.points(s["forecast_drop"]) in body
    assert "(allowed: 3.00)" in body and "2024-05-01T09:00:00+00:00" in body and "a" * 32 in body
