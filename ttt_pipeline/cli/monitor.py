"""`ttt-pipeline monitor`: judge a window of captured traffic now, as the hourly `traffic-monitor` deployment does.

    ttt-pipeline monitor --window 24h                       # the configuration's model and store (demo preset)
    ttt-pipeline monitor --model NAME --window 7d --json    # the summary as one JSON object on the last line

Exit status: 0 for ok and no_traffic (an empty window, or fewer than monitoring.min_records records), 3 for noisy
(the whole forecast interval lies above monitoring.max_drop, as `reevaluate` exits 3 on a regression), 2 for a
user error (`error:` / `hint:`). The verdict's event goes to the Prefect server of PREFECT_API_URL; without one it
is sent nowhere (the line says so) and nothing else changes. No Prefect server is started.
"""

from __future__ import annotations

import argparse
import json
import sys


def cmd_monitor(args) -> int:
    from prefect.settings import PREFECT_API_URL

    from ttt_pipeline import monitoring
    from ttt_pipeline.config import load_config
    from ttt_pipeline.events import flush_events
    from ttt_pipeline.flows.monitor import run_monitor

    cfg = load_config(args.config, args.set)
    if args.window:
        monitoring.parse_window(args.window)  # a bad duration stops here, before any read
    # without a server Prefect would start a temporary one to take the event, and stop it with the command
    out = run_monitor(cfg, args.window, args.end, args.model, args.calibration, emit=bool(PREFECT_API_URL.value()))
    if out["event"]["id"]:
        flush_events()
    print(monitoring.console_line(out))
    if out.get("note"):
        print(f"note: {out['note']}")
    for part in out["skipped_parts"]:
        print(f"skipped an unreadable traffic part: {part}", file=sys.stderr)
    sent = f"event {out['event']['name']} {out['event']['id']}" if out["event"]["id"] else \
        f"no event sent ({out['event']['name']}: PREFECT_API_URL unset)"
    run = f"MLflow run {out['mlflow_run_id']}" if out["mlflow_run_id"] else "nothing logged to MLflow"
    print(f"{sent}; {run}")
    if args.json:
        sys.stdout.flush()
        print(json.dumps(out, default=str))
    return monitoring.exit_code(out["verdict"])


def add_command(subparsers, config_help) -> None:
    m = subparsers.add_parser("monitor", help="judge a window of captured production traffic: forecast accuracy "
                              "drop without labels, verdict ok / noisy / no_traffic", description=__doc__.split("\n\n")[0],
                              epilog="exit status: 0 ok or no_traffic, 3 noisy, 2 a user error",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    m.add_argument("--config", default="demo", help=config_help("the monitoring section (store, window, max_drop), "
                                                                "tracking and the served model's task"))
    m.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field, e.g. monitoring.traffic_uri=s3://bucket/traffic or monitoring.max_drop=0.05")
    m.add_argument("--window", default=None, metavar="DURATION",
                   help="the window ending at --end: 30m, 24h, 7d (default: monitoring.window)")
    m.add_argument("--end", default=None, metavar="TIME",
                   help="the window's end, ISO-8601 (2024-05-01T12:00:00Z; no offset: UTC); default: now")
    m.add_argument("--model", default=None, metavar="NAME",
                   help="the registered model whose traffic is judged (default: the configuration's, else the "
                   "window's only model)")
    m.add_argument("--calibration", default=None, metavar="FILE",
                   help="a calibration JSON file to judge with (default: the one stored with the model version)")
    m.add_argument("--json", action="store_true", help="print the summary as one JSON object on the last line")
    m.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    m.set_defaults(fn=cmd_monitor)
