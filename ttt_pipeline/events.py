"""The project's Prefect events, in one home: the `champion` alias moving, the nightly check's outcome and the
traffic monitor's verdict (`ttt.traffic.ok`, `ttt.traffic.noisy`, `ttt.traffic.no-traffic`: `emit_traffic`).

`ttt.champion.promoted` is emitted wherever the alias moves (the pipeline's registry task, `ttt-pipeline promote`)
and followed by `ttt-pipeline serve`; `ttt.nightly.ok`, `ttt.nightly.regression` and `ttt.nightly.no-champion` tell
the night's outcome, and the automations of `ttt-pipeline alerts apply` act on them. This module sits between the
tasks and the library (the `cli -> flows -> tasks -> events` contract): the tasks, the flows and the command line
emit and follow events; io and the pure core never import Prefect.

Event: name `ttt.champion.promoted`; resource `ttt.registered-model.<name>` (the resource the nightly's events name
too, so one automation can match both); payload: model_name, version, metric, value, champion_before, reason.
MLflow 3's registry webhooks would tell the same thing, but only an MLflow server with webhooks enabled sends them
and each listener needs a reachable HTTP endpoint; a Prefect event reaches any subscriber of the Prefect server the
pipeline already reports to, and automations can act on it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

EVENT = "ttt.champion.promoted"
NIGHTLY = {"ok": "ttt.nightly.ok", "regression": "ttt.nightly.regression", "no_champion": "ttt.nightly.no-champion"}
TRAFFIC = {"ok": "ttt.traffic.ok", "noisy": "ttt.traffic.noisy", "no_traffic": "ttt.traffic.no-traffic"}
log = logging.getLogger(__name__)


def resource_id(model_name: str) -> str:
    return f"ttt.registered-model.{model_name}"


def emit_promoted(result: dict[str, Any]) -> str | None:
    """Emits EVENT for a registry decision (`RegistryResult.to_dict()`) that moved the alias; returns the event's id
    (None when nothing moved or no Prefect API is configured: a run without a server emits nowhere)."""
    if result.get("decision") != "promoted" or not result.get("version"):
        return None
    from prefect.events import emit_event

    name = result["model_name"]
    payload = {"model_name": name, "version": str(result["version"]), "metric": result.get("metric"),
               "value": result.get("candidate_value"), "champion_before": result.get("champion_before"),
               "reason": result.get("reason")}
    event = emit_event(event=EVENT, resource={"prefect.resource.id": resource_id(name),
                                              "prefect.resource.name": name}, payload=payload)
    return str(event.id) if event is not None else None


def emit_outcome(verdict: str, model_name: str | None, payload: dict) -> dict:
    """Emits the night's outcome as a Prefect event (resource: the registered model); returns its name and id
    (id None when no events client is configured)."""
    from prefect.events import emit_event

    name = NIGHTLY[verdict]
    resource = {"prefect.resource.id": resource_id(model_name or "none"), "prefect.resource.name": model_name or "none"}
    event = emit_event(event=name, resource=resource, payload=payload)
    return {"name": name, "id": str(event.id) if event is not None else None}


def emit_traffic(verdict: str, model_name: str | None, payload: dict) -> dict:
    """Emits a traffic window's verdict (`ttt.traffic.ok`, `.noisy`, `.no-traffic`; resource: the registered
    model, as the nightly's events) with the window's figures as payload; returns its name and id (id None when no
    events client is configured: PREFECT_API_URL unset)."""
    from prefect.events import emit_event

    name = TRAFFIC[verdict]
    resource = {"prefect.resource.id": resource_id(model_name or "none"), "prefect.resource.name": model_name or "none"}
    event = emit_event(event=name, resource=resource, payload=payload)
    return {"name": name, "id": str(event.id) if event is not None else None}


def flush_events(timeout: float = 10.0) -> None:
    """Sends the events emitted so far: a flow run does this when it ends; a plain command must before it exits."""
    from prefect.events.worker import EventsWorker

    EventsWorker.drain_all(timeout=timeout)


def promote_by_hand(tracking_uri: str | None, model_name: str, version: str) -> dict[str, Any]:
    """Moves the alias to `version` (io.registry.set_champion) and emits EVENT, so followers switch to it."""
    from ttt_pipeline.io import model_registry as registry
    from ttt_pipeline.io.mlflow_model import client_for

    client, _ = client_for(tracking_uri)
    result = registry.set_champion(client, model_name, version).to_dict()
    result["event_id"] = emit_promoted(result)
    flush_events()
    return result


def prefect_server_reachable() -> bool:
    """Whether PREFECT_API_URL is set and its server answers /health (events need a server to subscribe to)."""
    import urllib.error
    import urllib.request

    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        return False
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


async def _subscribe(model_name: str, on_event: Callable[[dict], None], stop: threading.Event) -> None:
    from prefect.events.clients import get_events_subscriber
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    event_filter = EventFilter(event=EventNameFilter(name=[EVENT]),
                               resource=EventResourceFilter(id=[resource_id(model_name)]))
    async with get_events_subscriber(filter=event_filter, reconnection_attempts=1000) as subscriber:
        async for event in subscriber:
            if stop.is_set():
                return
            on_event(dict(event.payload))


def follow_events(model_name: str, on_event: Callable[[dict], None], stop: threading.Event) -> threading.Thread:
    """Calls on_event(payload) for each EVENT of `model_name` (the server also replays recent ones when the
    subscription opens: harmless, the follower re-reads the alias and finds nothing to do), in a daemon thread."""

    def run() -> None:
        while not stop.is_set():
            try:
                asyncio.run(_subscribe(model_name, on_event, stop))
            except Exception as exc:  # the server went away: the subscriber's own reconnects gave up; start over
                log.warning("champion events: subscription ended (%s); resubscribing in 5 s", exc)
                stop.wait(5)

    thread = threading.Thread(target=run, name="champion-events", daemon=True)
    thread.start()
    return thread
