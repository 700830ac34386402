"""`ttt-pipeline alerts apply --block TYPE/NAME`: the nightly re-evaluation's and the traffic monitor's alerts as
Prefect automations.

The automations ship inside the package (ttt_pipeline/flows/nightly_automations.yaml and traffic_automations.yaml,
the format of `prefect automation create --from-file`): a regression, no champion, a crashed or failed nightly run,
no verdict at all in 26 hours, and a noisy window of production traffic (`ttt.traffic.noisy`). Prefect's own automations and notification blocks do the sending (Slack, Microsoft Teams, a custom
webhook, ...: any notification block the user has saved); this command only fills in the block the user names, which
a file cannot hold (a block's id differs per server), and creates them on the server of PREFECT_API_URL, replacing
automations of the same names, so it can be re-run. `alerts remove` deletes them.
"""

from __future__ import annotations

import argparse
import importlib.resources
from typing import Any
from uuid import UUID

from ttt_pipeline.errors import ConfigError

FILE = "nightly_automations.yaml"
FILES = (FILE, "traffic_automations.yaml")  # every file `apply` creates the automations of, in this order
PLACEHOLDER = "NOTIFICATION_BLOCK"
MISSED = "ttt-nightly-missed"  # the proactive automation: no verdict within its window
MISSED_HOURS = 26
BLOCK_HINT = ("save a notification block first (Prefect UI: Blocks -> + -> Slack Webhook, Microsoft Teams Webhook, "
              "Custom Webhook, ...; or in Python: SlackWebhook(url=...).save('ttt-alerts')), then pass "
              "--block slack-webhook/ttt-alerts; `prefect block ls` lists the saved ones")


def automations_text(file: str = FILE) -> str:
    return importlib.resources.files("ttt_pipeline.flows").joinpath(file).read_text(encoding="utf-8")


def _shipped() -> list[dict]:
    """Every shipped automation, as written (the placeholder block), in FILES' order."""
    import yaml

    return [item for file in FILES for item in yaml.safe_load(automations_text(file))["automations"]]


def _missed_window(item: dict, hours: float) -> None:
    """Sets the proactive automation's window, and the hours its texts name."""
    if hours * 3600 < 10:  # Prefect's floor for a proactive trigger
        raise ConfigError(f"--missed-after {hours:g}: the window must be at least 10 seconds", "pass --missed-after 26")
    item["trigger"]["within"] = round(hours * 3600, 3)
    item["description"] = item["description"].replace(f"{MISSED_HOURS} hours", f"{hours:g} hours")
    for action in item["actions"]:
        for key in ("subject", "body"):
            action[key] = action[key].replace(f"{MISSED_HOURS} hours", f"{hours:g} hours")


def automations(block_document_id: UUID | str, missed_after_hours: float = MISSED_HOURS) -> list[Any]:
    """The shipped automations with the notification block filled in (and the missed-night window, 26 h as
    shipped), validated by Prefect's own model."""
    from prefect.events.schemas.automations import AutomationCore

    data = _shipped()
    for item in data:
        for action in item["actions"]:
            if action.get("block_document_id") == PLACEHOLDER:
                action["block_document_id"] = str(block_document_id)
        if item["name"] == MISSED and missed_after_hours != MISSED_HOURS:
            _missed_window(item, missed_after_hours)
    return [AutomationCore.model_validate(item) for item in data]


def names() -> list[str]:
    return [item["name"] for item in _shipped()]


def notification_block_id(ref: str) -> UUID:
    """The saved block `TYPE/NAME`'s document id; an error naming --block unless it is a notification block."""
    import prefect.blocks.notifications  # noqa: F401  (registers Prefect's notification block types)
    from prefect.blocks.abstract import NotificationBlock
    from prefect.blocks.core import Block

    if ref.count("/") != 1 or not all(ref.split("/")):
        raise ConfigError(f"--block {ref!r} is not TYPE/NAME (a block type's slug and the block's name)", BLOCK_HINT)
    try:
        block = Block.load(ref)
    except (ValueError, KeyError) as exc:
        raise ConfigError(f"--block {ref!r}: no such block on the Prefect server ({str(exc).splitlines()[0]})",
                          BLOCK_HINT) from None
    if not isinstance(block, NotificationBlock):
        raise ConfigError(f"--block {ref!r} is a {type(block).__name__}, not a notification block", BLOCK_HINT)
    return block._block_document_id


def _replace(client, wanted: list[Any]) -> list[tuple[str, UUID]]:
    created = []
    for automation in wanted:
        for old in client.read_automations_by_name(automation.name):
            client.delete_automation(old.id)
        created.append((automation.name, client.create_automation(automation)))
    return created


def _server() -> None:
    """Automations live on a Prefect server: without PREFECT_API_URL the client would use a temporary one."""
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise ConfigError("PREFECT_API_URL is not set: the automations need the Prefect server the nightly runs on",
                          "export PREFECT_API_URL=http://127.0.0.1:4200/api (after `make servers`: source .run/env)")


def cmd_apply(args) -> int:
    from prefect.client.orchestration import get_client

    _server()
    wanted = automations(notification_block_id(args.block), args.missed_after)
    with get_client(sync_client=True) as client:
        created = _replace(client, wanted)
    for name, automation_id in created:
        print(f"automation {name} ({automation_id}): notifies {args.block}")
    return 0


def cmd_remove(args) -> int:
    from prefect.client.orchestration import get_client

    _server()
    with get_client(sync_client=True) as client:
        for name in names():
            for old in client.read_automations_by_name(name):
                client.delete_automation(old.id)
                print(f"automation {name} ({old.id}): deleted")
    return 0


def add_command(subparsers) -> None:
    a = subparsers.add_parser("alerts", help="the nightly re-evaluation's and the traffic monitor's alerts as "
                              "Prefect automations (regression, no champion, a crashed run, no verdict in 26 h, "
                              "noisy traffic)")
    sub = a.add_subparsers(dest="alerts_command", required=True)
    ap = sub.add_parser("apply", help="create the automations on the Prefect server (PREFECT_API_URL), notifying "
                        "the named block; re-running replaces them")
    ap.add_argument("--block", required=True, metavar="TYPE/NAME", help="a saved notification block, e.g. "
                    "slack-webhook/ttt-alerts, ms-teams-webhook/NAME or custom-webhook/NAME")
    ap.add_argument("--missed-after", type=float, default=MISSED_HOURS, metavar="HOURS",
                    help=f"alert when no nightly run reached a verdict for this long (default {MISSED_HOURS}: one "
                    "daily run plus slack; at least 10 seconds)")
    ap.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    ap.set_defaults(fn=cmd_apply)
    rm = sub.add_parser("remove", help="delete the automations `alerts apply` created")
    rm.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    rm.set_defaults(fn=cmd_remove)
