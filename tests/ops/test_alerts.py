"""The nightly's alerts as Prefect automations (ttt_pipeline/flows/nightly_automations.yaml, `ttt-pipeline alerts`):
each validates with Prefect's own automation models, and each trigger covers the events it is meant for, and only
those, by the server's own matching (no server needed)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from ttt_pipeline.cli import alerts
from ttt_pipeline.errors import ConfigError
from ttt_pipeline.events import NIGHTLY as EVENTS

REPO = Path(__file__).resolve().parents[2]
BLOCK = uuid.uuid4()


@pytest.fixture(scope="module")
def shipped():
    return {a.name: a for a in alerts.automations(BLOCK)}


def test_every_automation_validates_and_notifies_the_named_block(shipped):
    from prefect.events.schemas.automations import AutomationCore
    from prefect.server.events.schemas.automations import AutomationCore as ServerAutomationCore

    assert set(shipped) == {"ttt-nightly-regression", "ttt-nightly-no-champion", "ttt-nightly-crashed",
                            "ttt-nightly-missed", "ttt-traffic-noisy"} == set(alerts.names())
    for name, automation in shipped.items():
        assert isinstance(automation, AutomationCore) and automation.enabled
        ServerAutomationCore.model_validate(automation.model_dump(mode="json"))  # as the server stores it
        (action,) = automation.actions
        assert action.type == "send-notification" and action.block_document_id == BLOCK, name
        assert action.subject and action.body
    raw = yaml.safe_load(alerts.automations_text())["automations"]
    assert all(a["block_document_id"] == alerts.PLACEHOLDER for item in raw for a in item["actions"])


def test_the_file_ships_inside_the_package():
    import importlib.resources

    assert importlib.resources.files("ttt_pipeline.flows").joinpath(alerts.FILE).is_file()
    assert "*.yaml" in (REPO / "pyproject.toml").read_text()  # package data of every package


def _server_trigger(automation):
    from prefect.server.events.schemas.automations import EventTrigger

    return EventTrigger.model_validate(automation.trigger.model_dump(mode="json"))


def _event(name: str, resource: dict, related: list[dict] | None = None):
    from prefect.server.events.schemas.events import ReceivedEvent

    now = datetime.now(timezone.utc)
    return ReceivedEvent(occurred=now, received=now, event=name, resource=resource, related=related or [],
                         payload={}, id=uuid.uuid4())


def _outcome(verdict: str):
    """The event ttt_pipeline.tasks.nightly.emit_outcome sends."""
    return _event(EVENTS[verdict], {"prefect.resource.id": "ttt.registered-model.ttt-demo-reviews-negative-positive",
                                    "prefect.resource.name": "ttt-demo-reviews-negative-positive"})


def _flow_run(state: str, flow: str = "nightly-reevaluation", deployment: str | None = "nightly-reevaluation"):
    """The event Prefect's server sends on a flow run's state change, with its flow and deployment as related."""
    related = [{"prefect.resource.id": f"prefect.flow.{uuid.uuid4()}", "prefect.resource.role": "flow",
                "prefect.resource.name": flow}]
    if deployment:
        related.append({"prefect.resource.id": f"prefect.deployment.{uuid.uuid4()}",
                        "prefect.resource.role": "deployment", "prefect.resource.name": deployment})
    return _event(f"prefect.flow-run.{state}", {"prefect.resource.id": f"prefect.flow-run.{uuid.uuid4()}",
                                                 "prefect.resource.name": "sly-fox"}, related)


def test_outcome_triggers_cover_their_own_event_only(shipped):
    regression = _server_trigger(shipped["ttt-nightly-regression"])
    no_champion = _server_trigger(shipped["ttt-nightly-no-champion"])
    assert regression.covers(_outcome("regression")) and not regression.covers(_outcome("ok"))
    assert no_champion.covers(_outcome("no_champion")) and not no_champion.covers(_outcome("regression"))
    for trigger in (regression, no_champion):
        assert trigger.posture == "Reactive" and trigger.immediate  # one notification per event, at once


def test_crash_trigger_covers_a_failed_or_crashed_nightly_deployment_run_only(shipped):
    crashed = _server_trigger(shipped["ttt-nightly-crashed"])
    for state in ("Crashed", "Failed", "TimedOut"):
        assert crashed.covers(_flow_run(state)), state
    assert not crashed.covers(_flow_run("Completed"))
    assert not crashed.covers(_flow_run("Regression"))  # a verdict, with its own alert
    assert not crashed.covers(_flow_run("Failed", flow="ttt-pipeline", deployment="ttt-pipeline"))
    assert not crashed.covers(_flow_run("Failed", deployment=None))  # `ttt-pipeline reevaluate` in a terminal


def test_missed_night_trigger_is_proactive_over_every_verdict_for_26_hours(shipped):
    missed = _server_trigger(shipped["ttt-nightly-missed"])
    assert missed.posture == "Proactive" and missed.threshold == 1 and missed.within == timedelta(hours=26)
    for verdict in EVENTS:  # any verdict is a night that ran
        assert missed.covers(_outcome(verdict)), verdict
    assert not missed.covers(_flow_run("Completed"))


def test_the_names_match_the_nightly_deployment_and_flow():
    from ttt_pipeline.flows.reevaluate import nightly_reevaluation

    deployments = {d["entrypoint"]: d["name"] for d in yaml.safe_load((REPO / "prefect.yaml").read_text())[
        "deployments"]}
    raw = {a["name"]: a for a in yaml.safe_load(alerts.automations_text())["automations"]}
    related = {r["prefect.resource.role"]: r["prefect.resource.name"]
               for r in raw["ttt-nightly-crashed"]["trigger"]["match_related"]}
    assert related == {"flow": nightly_reevaluation.name,
                       "deployment": deployments["ttt_pipeline.flows.reevaluate.nightly_reevaluation"]}


def test_apply_replaces_automations_of_the_same_names(shipped):
    class Client:
        def __init__(self):
            self.stored = {uuid.uuid4(): "ttt-nightly-regression", uuid.uuid4(): "someone-elses"}

        def read_automations_by_name(self, name):
            return [type("A", (), {"id": i}) for i, n in self.stored.items() if n == name]

        def delete_automation(self, automation_id):
            del self.stored[automation_id]

        def create_automation(self, automation):
            self.stored[new := uuid.uuid4()] = automation.name
            return new

    client = Client()
    created = alerts._replace(client, list(shipped.values()))
    assert [name for name, _ in created] == list(shipped)
    assert sorted(client.stored.values()) == sorted([*shipped, "someone-elses"])


@pytest.mark.parametrize("ref", ["slack-webhook", "slack-webhook/", "/x", "a/b/c"])
def test_a_block_that_is_not_type_slash_name_is_a_config_error(ref):
    with pytest.raises(ConfigError, match="--block") as err:
        alerts.notification_block_id(ref)
    assert "slack-webhook/ttt-alerts" in err.value.hint


def test_apply_without_a_server_says_which_setting(monkeypatch, capsys):
    from ttt_pipeline.cli.main import main

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: None}):
        assert main(["alerts", "apply", "--block", "slack-webhook/ttt-alerts"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: PREFECT_API_URL is not set") and "hint: export PREFECT_API_URL=" in err


def test_the_missed_night_window_can_be_set_and_is_named_in_the_texts():
    missed = {a.name: a for a in alerts.automations(BLOCK, missed_after_hours=0.01)}["ttt-nightly-missed"]
    assert missed.trigger.within == timedelta(seconds=36)
    (action,) = missed.actions
    assert "0.01 hours" in action.subject and "26" not in action.subject + action.body + missed.description
    others = {a.name: a for a in alerts.automations(BLOCK, missed_after_hours=0.01)}
    assert others["ttt-nightly-regression"] == {a.name: a for a in alerts.automations(BLOCK)}["ttt-nightly-regression"]
    with pytest.raises(ConfigError, match="at least 10 seconds"):
        alerts.automations(BLOCK, missed_after_hours=0.001)
