"""`ttt-pipeline explain RUN_ID --example N`: the training reviews behind one explained prediction.

Reads the `attribute` stage's `attribution_targets.json` from MLflow (the run needs `attribution.enabled`);
RUN_ID is the pipeline run or any of its stages' runs. N is the test review's index in its set; every explained
set holding that review is shown (`--set` picks one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
from pathlib import Path

from ttt_pipeline.errors import PipelineError


def attribution_of(client, pipeline_run, uri: str) -> dict:
    children = client.search_runs([pipeline_run.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{pipeline_run.info.run_id}' and "
                                  "attributes.run_name = 'attribute'")
    if not children:
        raise PipelineError(f"pipeline run {pipeline_run.info.run_id} at {uri} has no attribute stage",
                            "run the pipeline with --set attribution.enabled=true (configs/mdsd-electronics.yaml "
                            "enables it)")
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


def cmd_explain(args) -> int:
    from ttt_pipeline.evaluation.attribution import format_target
    from ttt_pipeline.io.runs import default_tracking_uri, get_pipeline_run, open_client

    client, uri = open_client(args.tracking_uri or default_tracking_uri())
    result = attribution_of(client, get_pipeline_run(client, args.run_id, uri), uri)
    targets = pick(result, args.example, args.set)
    if args.json:
        print(json.dumps({"n_train": result["n_train"], "params": result["params"], "targets": targets},
                         ensure_ascii=False))
    else:
        print(f"TRAK over {result['n_train']} training reviews ({result['params']}, {result['n_models']} model(s), "
              f"projection {result['proj_dim']}); scores: + raises the attributed class's margin, - lowers it\n")
        print("\n\n".join(format_target(t, args.top) for t in targets))
    return 0


def add_command(subparsers) -> None:
    e = subparsers.add_parser("explain", help="training reviews that support and oppose an explained prediction "
                              "(needs attribution.enabled)")
    e.add_argument("run_id", metavar="RUN_ID", help="MLflow run id of the pipeline run (or of one of its stages)")
    e.add_argument("--example", type=int, required=True, metavar="N", help="index of the test review in its set")
    e.add_argument("--set", default=None, help="the explained set (clean, shift_<domain>, <family>-<severity>)")
    e.add_argument("--top", type=int, default=None, metavar="K", help="show only the first K of each list")
    e.add_argument("--tracking-uri", default=None,
                   help="MLflow tracking URI (default: $TTT_TRACKING_URI, else $MLFLOW_TRACKING_URI, else the demo "
                   "preset's sqlite:///mlflow.db)")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    e.set_defaults(fn=cmd_explain)
