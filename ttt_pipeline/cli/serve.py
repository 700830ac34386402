"""`ttt-pipeline serve`: the champion as a REST endpoint that follows the `champion` alias; `ttt-pipeline promote`:
move the alias by hand.

    ttt-pipeline serve --model ttt-demo-reviews-negative-positive            # http://127.0.0.1:5001/invocations
    ttt-pipeline promote --model ttt-demo-reviews-negative-positive --version 3

`serve` runs `mlflow models serve` for the champion behind a small front in this process
(`ttt_pipeline.io.serving`) and switches to a new champion without a failed request. It learns of a new champion
from the Prefect event `ttt.champion.promoted` (`ttt_pipeline.events`) when a Prefect server answers at
PREFECT_API_URL; otherwise it polls the registry alias every --poll-s seconds. With `--set monitoring.capture=true`
each back end records what it is asked into monitoring.traffic_uri (`ttt_pipeline.io.traffic_recorder`), naming the
model's name and version; `ttt-pipeline monitor` judges it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

DEFAULT_MODEL = "ttt-demo-reviews-negative-positive"
CHAMPION = "champion"
# With events, a look at the alias this often anyway: an event lost while the subscription was (re)connecting (on a
# busy machine an event emitted soon after `serve` started has reached no subscriber), or an alias moved with MLflow's
# own client (no event), is picked up within this time: one small registry request each 30 s.
EVENTS_SAFETY_POLL_S = 30.0


def _follow_mode(requested: str) -> str:
    from ttt_pipeline.events import prefect_server_reachable

    if requested != "auto":
        return requested
    return "events" if prefect_server_reachable() else "poll"


def _start_following(server, mode: str, poll_s: float, stop: threading.Event) -> None:
    """Events when a Prefect server answers: a switch starts the moment the alias moves, and nothing polls the
    registry. Polling the alias otherwise: a run without a Prefect server (the default, `ttt-pipeline run` with
    its temporary server) emits its event nowhere a subscriber could see, and MLflow's registry webhooks need an
    MLflow server with webhooks configured; reading one alias every few seconds costs one small request."""
    from ttt_pipeline.events import follow_events

    wake = threading.Event()
    if mode == "events":
        follow_events(server.model_name, lambda payload: wake.set(), stop)
        interval = EVENTS_SAFETY_POLL_S
    else:
        interval = poll_s
    if mode != "off":
        threading.Thread(target=server.follow, args=(wake, stop, interval), name="follow", daemon=True).start()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def cmd_serve(args) -> int:
    from ttt_pipeline.io.mlflow_model import client_for
    from ttt_pipeline.io.serving import ChampionServer

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)
    logging.getLogger("ttt_pipeline").setLevel(logging.INFO)
    monitoring = _monitoring(args)
    client, uri = client_for(args.tracking_uri)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="ttt-serve-"))
    name, alias = model_and_alias(args.model, args.alias)
    server = ChampionServer(client, name, uri, log_dir, ready_timeout_s=args.ready_timeout_s,
                            monitoring=monitoring, alias=alias, workers=_workers(args.workers))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, _interrupt)  # `docker stop`, a supervisor: stop the model servers too
    try:
        front = server.start(args.host, args.port)
        # a user's own alias moving sends no event (only a champion promotion does): it is polled
        mode = _follow_mode(args.follow) if alias == CHAMPION or args.follow in ("poll", "off") else "poll"
        captured = (f"traffic captured into {monitoring.traffic_uri}" + ("" if monitoring.store_text else
                                                                         " without texts")
                    if monitoring.capture else "no traffic captured")
        followed = "the champion" if alias == CHAMPION else f"the alias {alias}"
        print(f"serve: {name} v{front.backend.version} from {uri} on http://{args.host}:{args.port} "
              f"(POST /invocations, GET /ping; follows {followed}: {mode}; {captured}; back-end logs in {log_dir})",
              flush=True)
        _start_following(server, mode, args.poll_s, stop)
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.close()
    return 0


def _workers(value: int) -> int:
    from ttt_pipeline.errors import ConfigError

    if value < 1:
        raise ConfigError(f"--workers {value}: a server needs at least one scoring process",
                          "give --workers 1 (the default) or the number of cores to use (threads are split)")
    return value


def _monitoring(args):
    """The configuration's monitoring section (`--config`, `--set monitoring.capture=true`), its store's local
    folder made absolute: what the back ends capture under."""
    from ttt_pipeline.config import load_config
    from ttt_pipeline.monitoring import traffic_location

    monitoring = load_config(args.config, args.set).monitoring
    return monitoring.model_copy(update={"traffic_uri": traffic_location(monitoring.traffic_uri)})


def model_and_alias(model: str, alias: str) -> tuple[str, str]:
    """(registered model, alias) from --model NAME (with --alias) or --model models:/NAME@ALIAS."""
    from ttt_pipeline.errors import ConfigError

    if not model.startswith("models:/"):
        return model, alias
    name, at, given = model[len("models:/"):].partition("@")
    if not at or not name or not given or "/" in name:
        raise ConfigError(f"--model {model}: serve follows an alias, models:/NAME@ALIAS (or NAME with --alias)",
                          "a fixed version is served by `mlflow models serve -m models:/NAME/VERSION`")
    return name, given


def cmd_promote(args) -> int:
    from ttt_pipeline.events import promote_by_hand

    result = promote_by_hand(args.tracking_uri, args.model, args.version)
    sent = f"event ttt.champion.promoted {result['event_id']}" if result["event_id"] else \
        "no event sent (PREFECT_API_URL unset: followers polling the registry still switch)"
    print(f"promote: {result['model_name']} v{result['version']} is the champion ({result['reason']}); {sent}")
    return 0


def add_commands(subparsers) -> None:
    s = subparsers.add_parser("serve", help="serve the registered champion as a REST endpoint that switches to a new "
                              "champion when the alias moves, without a failed request",
                              description=__doc__.split("\n\n")[0])
    s.add_argument("--model", default=os.environ.get("TTT_SERVE_MODEL", DEFAULT_MODEL), metavar="NAME",
                   help="registered model name (ttt-<task>-<labels>; default $TTT_SERVE_MODEL, else the demo's), or "
                   "models:/NAME@ALIAS to follow an alias of your own")
    s.add_argument("--alias", default=CHAMPION, help="the alias followed (default: champion; e.g. prod for your "
                   "own registered model)")
    s.add_argument("--tracking-uri", default=None, help="MLflow tracking/registry URI (default $TTT_TRACKING_URI, "
                   "else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    s.add_argument("--host", default=os.environ.get("TTT_HOST", "127.0.0.1"), help="address to listen on")
    s.add_argument("--port", type=int, default=int(os.environ.get("TTT_SERVE_PORT", "5001")), help="port to listen on")
    s.add_argument("--follow", choices=["auto", "events", "poll", "off"], default="auto",
                   help="how a new champion is noticed: Prefect events (needs PREFECT_API_URL), polling the alias, "
                   "or never; auto: events when a Prefect server answers, else poll")
    s.add_argument("--poll-s", type=float, default=10.0, help="seconds between looks at the alias when polling")
    s.add_argument("--ready-timeout-s", type=float, default=300.0,
                   help="how long a new version's server may take to answer before it is given up (the old one "
                   "keeps serving)")
    s.add_argument("--workers", type=int, default=int(os.environ.get("TTT_SERVE_WORKERS", "1")),
                   help="scoring processes per model server (MLflow's --workers), the cores split between them")
    s.add_argument("--log-dir", default=None, help="folder for the model servers' logs (default: a temporary one)")
    s.add_argument("--config", default=None, help="YAML file or preset name whose monitoring section says whether "
                   "and where the served model records its traffic (default: no preset, capture off)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field, e.g. monitoring.capture=true or monitoring.traffic_uri=s3://bucket/traffic")
    s.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    s.set_defaults(fn=cmd_serve)

    p = subparsers.add_parser("promote", help="move the `champion` alias to a version by hand (emits "
                              "ttt.champion.promoted, so `serve` switches to it)")
    p.add_argument("--model", required=True, metavar="NAME", help="registered model name")
    p.add_argument("--version", required=True, help="the version to make the champion")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking/registry URI (default $TTT_TRACKING_URI, "
                   "else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.set_defaults(fn=cmd_promote)
