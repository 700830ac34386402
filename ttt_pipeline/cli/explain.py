"""`ttt-pipeline explain RUN_ID --example N`: the training reviews behind one explained prediction.

Reads the `attribute` stage's `attribution_targets.json` from MLflow (the run needs `attribution.enabled`);
RUN_ID is the pipeline run or any of its stages' runs. N is the test review's index in its set; every explained
set holding that review is shown (`--set` picks one).
"""

from __future__ import annotations

import argparse
import json


def cmd_explain(args) -> int:
    from ttt_pipeline.evaluation.attribution import format_target
    from ttt_pipeline.io.explain import explain

    result, targets = explain(args.run_id, args.example, args.set, args.tracking_uri)
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
