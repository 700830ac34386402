"""The label-free drop forecast's calibration in MLflow (issue 69): `calibration.json` on the pipeline's parent run,
written by the run (steps.calibrate), read back for a registered model version by whatever watches its traffic.

The payload is the calibrate step's file as it is (ttt_pipeline/steps/calibrate_step.py: `calibration`,
`reference`, `sets`); the parent run also gets `forecast/loo_mae` and `forecast/coverage`, so runs can be compared
by how well their forecast held out.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ttt_pipeline.io.tracking import Tracker

ARTIFACT = "calibration.json"


def log_calibration(tracker: Tracker, parent_run_id: str, payload: dict) -> None:
    """`payload` as the artifact `calibration.json` of the parent run, and its held-out error and coverage as the
    metrics `forecast/loo_mae` and `forecast/coverage`."""
    from ttt_pipeline.steps import calibration_summary

    summary = calibration_summary(payload)
    tracker.dict(parent_run_id, payload, ARTIFACT)
    tracker.metrics(parent_run_id, {"forecast/loo_mae": summary["loo_mae"], "forecast/coverage": summary["coverage"]})


def parent_run(client, model_version) -> str | None:
    """The pipeline run that made a registered model version: its `parent_run_id` tag (set at registration), else
    the parent of the version's source run (the fine-tune or import-model child run); None when neither names one."""
    parent = (model_version.tags or {}).get("parent_run_id")
    if not parent and model_version.run_id:
        parent = client.get_run(model_version.run_id).data.tags.get("mlflow.parentRunId")
    return parent or None


def load_calibration(client, model_version) -> dict | None:
    """The `calibration.json` of the pipeline run that made `model_version` (an MLflow ModelVersion; `client` an
    MlflowClient), as the dict `log_calibration` logged; None when that run, or its calibration, is absent (a run
    that skipped calibration, a run logged before it existed, a deleted run)."""
    from mlflow.exceptions import MlflowException

    try:
        parent = parent_run(client, model_version)
        if parent is None or ARTIFACT not in {a.path for a in client.list_artifacts(parent)}:
            return None
        with tempfile.TemporaryDirectory(prefix="ttt-calibration-") as tmp:
            return json.loads(Path(client.download_artifacts(parent, ARTIFACT, tmp)).read_text(encoding="utf-8"))
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":  # a deleted run: no calibration to read
            return None
        raise
