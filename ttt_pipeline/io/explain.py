"""The training reviews behind one explained prediction (`ttt-pipeline explain RUN_ID --example N`).

Reads the `attribute` stage's `attribution_targets.json` from MLflow (the run needs `attribution.enabled`);
the run id is the pipeline run or any of its stages' runs. The example is the test review's index in its set;
every explained set holding that review is returned unless one is named.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from ttt_pipeline.errors import PipelineError, extra_hint, extra_installed


def attribution_of(client, pipeline_run, uri: str) -> dict:
    children = client.search_runs([pipeline_run.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{pipeline_run.info.run_id}' and "
                                  "attributes.run_name = 'attribute'")
    if not children:
        hint = ("run the pipeline with --set attribution.enabled=true (configs/mdsd-electronics.yaml enables it)")
        if not extra_installed("attribution"):  # the attribute step needs traker: say so before the run is made
            hint = f"{extra_hint('attribution')}, then {hint}"
        raise PipelineError(f"pipeline run {pipeline_run.info.run_id} at {uri} has no attribute stage", hint)
    with tempfile.TemporaryDirectory(prefix="ttt-explain-") as tmp, _quiet_download():
        try:
            path = client.download_artifacts(children[0].info.run_id, "attribution_targets.json", tmp)
        except Exception as exc:
            raise PipelineError(f"the attribute stage of run {pipeline_run.info.run_id} has no "
                                f"attribution_targets.json ({type(exc).__name__})",
                                "re-run the pipeline; the stage logs it when it finishes") from None
        return json.loads(Path(path).read_text())


@contextlib.contextmanager
def _quiet_download():
    """No MLflow download bar on stderr: the command's output is the explanation (or error: / hint:)."""
    key = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    before = os.environ.get(key)
    os.environ[key] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def pick(result: dict, example: int, set_name: str | None = None) -> list[dict]:
    """The explained targets for test review `example` (in `set_name` when given)."""
    found = [t for t in result["targets"] if t["index"] == example and (set_name is None or t["set"] == set_name)]
    if not found:
        known = sorted({(t["set"], t["index"]) for t in result["targets"]})
        listing = ", ".join(f"{s}:{i}" for s, i in known[:30]) or "none"
        raise PipelineError(f"example {example}{f' of set {set_name}' if set_name else ''} was not explained "
                            f"(explained: {listing})",
                            "pick one of those, or raise attribution.max_targets and re-run")
    return found


def explain(run_id: str, example: int, set_name: str | None = None,
            tracking_uri: str | None = None) -> tuple[dict, list[dict]]:
    """The attribute stage's result of a pipeline run and its explained targets for test review `example`."""
    from ttt_pipeline.io.client import default_tracking_uri, open_client
    from ttt_pipeline.io.runs import get_pipeline_run

    client, uri = open_client(tracking_uri or default_tracking_uri())
    result = attribution_of(client, get_pipeline_run(client, run_id, uri), uri)
    return result, pick(result, example, set_name)
