"""`ttt-pipeline report RUN_ID` and `ttt-pipeline compare RUN_A RUN_B`: a run's headline from MLflow.

Both read the pipeline (parent) run through `MlflowClient`; a stage's child run id is accepted and resolved to
its pipeline run. The tracking URI defaults to the demo preset's (`sqlite:///mlflow.db` in the current
folder), or $TTT_TRACKING_URI, else $MLFLOW_TRACKING_URI, or --tracking-uri.
"""

from __future__ import annotations

import argparse
import json
import sys

from ttt_pipeline.io import runs


def cmd_report(args) -> int:
    s = runs.report(args.run_id, args.tracking_uri)
    print(json.dumps(s, default=str) if args.json else runs.format_report(s))
    return 0


def cmd_compare(args) -> int:
    c = runs.compare(args.run_a, args.run_b, args.tracking_uri)
    print(json.dumps(c, default=str) if args.json else runs.format_compare(c))
    sys.stdout.flush()
    return 0


def add_commands(subparsers) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--tracking-uri", default=None,
                        help="MLflow tracking URI (default: $TTT_TRACKING_URI, else $MLFLOW_TRACKING_URI, else "
                        "the demo preset's sqlite:///mlflow.db)")
    common.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    # SUPPRESS as default too: else the subcommand's False overwrites a `ttt-pipeline --debug report`
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    r = subparsers.add_parser("report", parents=[common], help="print the headline table of a pipeline run")
    r.add_argument("run_id", metavar="RUN_ID", help="MLflow run id of the pipeline run (or of one of its stages)")
    r.set_defaults(fn=cmd_report)

    c = subparsers.add_parser("compare", parents=[common], help="two pipeline runs side by side, with differences")
    c.add_argument("run_a", metavar="RUN_A", help="MLflow run id of the first pipeline run (or of one of its "
                   "stages): the baseline")
    c.add_argument("run_b", metavar="RUN_B", help="MLflow run id of the second run of the same task: each "
                   "difference is RUN_B minus RUN_A")
    c.set_defaults(fn=cmd_compare)
