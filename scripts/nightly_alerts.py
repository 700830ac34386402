"""The nightly alarm's notification: a Prefect automation that turns every `ttt.nightly.regression` event (emitted
by ttt_pipeline/flows/reevaluate.py) into a POST to a webhook.

    TTT_ALERT_WEBHOOK_URL=https://hooks.example.com/... PREFECT_API_URL=http://127.0.0.1:4200/api \\
        .venv/bin/python scripts/nightly_alerts.py

The URL comes from the environment only (never from a file in the repository). It is saved in a Prefect
`CustomWebhookNotificationBlock` named `ttt-nightly-regression` (its JSON body: subject, body and the event's
figures), and an automation of the same name (re-created on every call, so the script can be re-run) sends it
once per regression event. With TTT_ALERT_WEBHOOK_URL unset nothing is created, and an automation left by an
earlier call is deleted: nothing is sent. Run it after `prefect deploy --all`, against the same server.
"""

from __future__ import annotations

import os
import sys

NAME = "ttt-nightly-regression"
EVENT = "ttt.nightly.regression"
SUBJECT = "ttt-pipeline: nightly regression of {{ event.payload.model_name }}"
BODY = ("Robust accuracy of {{ event.payload.model_name }} v{{ event.payload.model_version }} under "
        "{{ event.payload.defense }} fell on the reference suite (night {{ event.payload.night }}): change "
        "{{ event.payload.reference.delta }} [{{ event.payload.reference.ci_low }}, "
        "{{ event.payload.reference.ci_high }}] against {{ event.payload.reference.against }}; MLflow run "
        "{{ event.payload.mlflow_run_id }}.")


def _delete_existing() -> None:
    from prefect.automations import Automation

    try:
        while (old := Automation.read(name=NAME)) is not None:
            old.delete()
    except ValueError:  # none of that name
        pass


def install(url: str | None) -> str | None:
    """Creates (or replaces) the block and the automation; returns the automation id, None when url is unset."""
    from prefect.automations import Automation, EventTrigger, Posture, SendNotification
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    _delete_existing()
    if not url:
        return None
    block = CustomWebhookNotificationBlock(
        name=NAME, url=url, method="POST",
        json_data={"subject": "{{subject}}", "body": "{{body}}", "source": "ttt-pipeline"})
    block_id = block.save(NAME, overwrite=True)
    automation = Automation(
        name=NAME, description="Notify the webhook of TTT_ALERT_WEBHOOK_URL on every nightly regression",
        trigger=EventTrigger(expect={EVENT}, match={"prefect.resource.id": "ttt.registered-model.*"},
                             posture=Posture.Reactive, threshold=1, within=0),
        actions=[SendNotification(block_document_id=block_id, subject=SUBJECT, body=BODY)])
    return str(automation.create().id)


def main() -> int:
    url = os.environ.get("TTT_ALERT_WEBHOOK_URL", "").strip()
    created = install(url or None)
    if created is None:
        print(f"TTT_ALERT_WEBHOOK_URL is not set: no automation '{NAME}' (an earlier one was removed); "
              "nothing will be sent")
    else:
        print(f"automation '{NAME}' ({created}): every {EVENT} event is posted to the webhook of "
              "TTT_ALERT_WEBHOOK_URL")
    return 0


if __name__ == "__main__":
    sys.exit(main())
