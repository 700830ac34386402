"""`ttt-pipeline`: run the pipeline, corrupt texts, classify reviews, inspect configuration and runs.

User errors print as `error:` and `hint:` lines with a non-zero exit and no traceback (`--debug` shows it).
The `run` command validates configuration, data, tokenizer and tracking before Prefect starts, so a bad
input never reaches training.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ttt_pipeline.cli import gate
from ttt_pipeline.errors import PipelineError

EXIT_USER, EXIT_BUG = 2, 1


def _env_defaults(store: Path) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("PREFECT_RESULTS_LOCAL_STORAGE_PATH", str((store / "prefect-results").resolve()))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect's temporary server gets 20 s to start by default: not enough on a busy 2-core machine
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    # MLflow's telemetry reads DO_NOT_TRACK only as "true"; its thread also sets and unsets an environment variable,
    # which races with any copy of os.environ another thread makes (a subprocess's env)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # its INFO lines (model validation) are noise here


def _few_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives each thread that allocates its own 64 MB malloc arena (up to 8 per core); Prefect, MLflow and
    torch start dozens of threads, so a run's address space grew past 4 GB at 1.8 GB resident and died under
    `ulimit -v 4000000`. Two arenas cap that at no measurable cost here (our work runs in torch's own pools).
    MALLOC_ARENA_MAX in the environment wins; other C libraries: nothing to do."""
    if os.environ.get("MALLOC_ARENA_MAX") or not sys.platform.startswith("linux"):
        return
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt(-8, arenas)  # -8: M_ARENA_MAX
    except (OSError, AttributeError):
        pass  # not glibc (musl has no arenas to cap)


def _system_arrow_pool() -> None:
    """pyarrow's default pool (mimalloc) reserves 1 GiB of address space when `datasets` loads: no resident memory,
    but under `ulimit -v 4000000` the demo on 64 training reviews ran out in evaluate at 4.27 GB of address
    space; with the system allocator it completes. The run's few Arrow tables (tokenised
    datasets, predictions) do not need mimalloc. ARROW_DEFAULT_MEMORY_POOL in the environment wins."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


def preflight(cfg) -> bool:
    """Everything that can be wrong with the inputs, checked before any training (results are cached).

    Returns whether it built the download step (the flow's download task then finds it cached). Cheapest first:
    local data (a read of the files) is checked before MLflow and the tokenizer (about 4 s of imports on 2 cores),
    so a bad file fails in about 2 s; a remote source is fetched last, after the checks that download nothing."""
    from ttt_pipeline import steps
    from ttt_pipeline.data.sources import Source
    from ttt_pipeline.io.tracking import Tracker
    from ttt_pipeline.modeling.tokenize import load_tokenizer
    from ttt_pipeline.storage import StepStore

    if cfg.attribution.enabled:  # an optional extra, checked before any work like the other inputs
        from ttt_pipeline.evaluation.attribution import require_traker

        require_traker()
    d = cfg.data
    sources = [d.path, *([d.test_path] if d.test_path else []), *d.shift.values()]
    local = all(Source.parse(s).kind == "local" for s in sources)
    store = StepStore(cfg.store)
    download = steps.download(cfg, store) if local else None
    Tracker.from_config(cfg.tracking).check()
    load_tokenizer(cfg.model.name, cfg.model.trust_remote_code)
    return not (download or steps.download(cfg, store)).cached


def preflight_model(cfg):
    """`evaluate`'s checks before Prefect starts: the data, MLflow, then the model itself, imported into the store
    (its folder, head, tokenizer, labels against the data's, MLM head): a bad model fails in seconds with nothing
    written to MLflow, and the flow's import task finds the entry made here. Returns the download step's output."""
    from ttt_pipeline import steps
    from ttt_pipeline.io.model_source import fetched
    from ttt_pipeline.io.tracking import Tracker
    from ttt_pipeline.storage import StepStore

    store = StepStore(cfg.store)
    data = steps.download(cfg, store)
    Tracker.from_config(cfg.tracking).check()
    with fetched(cfg.model.classifier, cfg.tracking.tracking_uri) as source:
        model = steps.import_model(cfg, data, source, store)
    steps.evaluated_config(cfg, model)  # a default defense the model cannot run stops here
    return data


def start_prefect_server() -> None:
    """Start this process's temporary Prefect server, one process at a time per Prefect home.

    Two runs started together on a fresh home would each migrate the same SQLite database and one server
    dies with `index ... already exists` (Prefect then retries on another port, after printing the
    traceback). Prefect keeps one temporary server per process, so the flow reuses the one started here.
    """
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return  # a real server (or none at all, which Prefect reports itself)
    from filelock import FileLock
    from prefect.server.api.server import SubprocessASGIServer

    home = Path(PREFECT_HOME.value()).expanduser()
    home.mkdir(parents=True, exist_ok=True)
    with FileLock(str(home / ".ttt-server-start.lock")):
        SubprocessASGIServer().start()


def cmd_run(args) -> int:
    from ttt_pipeline.cli.console import setup_run_logging
    from ttt_pipeline.cli.stopping import StopOnSignal
    from ttt_pipeline.config import absolute_paths, load_config

    cfg = absolute_paths(load_config(args.config, args.set))
    gate.rules(args)  # a malformed --fail-if stops here, before any work
    _env_defaults(Path(cfg.store))
    setup_run_logging()  # stage lines and progress; Prefect's per-task "Finished in state" lines are dropped
    with StopOnSignal(cfg):  # Ctrl-C / SIGTERM: one line (what the store keeps, how to resume), exit in seconds
        _say(f"checking the configuration, the data ({cfg.data.path}), the tokenizer and MLflow")
        download_built = preflight(cfg)
        _say("starting Prefect (a temporary local server unless PREFECT_API_URL names one)")
        start_prefect_server()
        from ttt_pipeline.flows.pipeline import ttt_pipeline

        summary = ttt_pipeline(config=cfg)
    return _print_summary(summary, cfg, args, " (download prepared by this run's input check)" if download_built else "")


def _print_summary(summary: dict, cfg, args, cached_note: str = "") -> int:
    """The run's table (the same numbers as the MLflow metrics; `ttt-pipeline report RUN_ID` prints every
    difference), its notes, cache hits, MLflow run and UI commands, then the registered model and the commands to
    use it next (`next_commands`) and the --fail-if rules' outcome (cli.gate); with `args.json`, the summary as the
    last line. Returns the exit status: the gate's."""
    from ttt_pipeline.cli.console import summary_table, ui_lines
    from ttt_pipeline.cli.next_steps import next_commands, next_lines, rerun_arguments
    from ttt_pipeline.reports.run import run_link

    print("\n" + summary_table(summary, cfg))
    for note in summary.get("notes") or []:
        print(f"note: {note}")
    tasks = f"{summary['cached_tasks']}/{len(summary['cached'])}"  # the flow's tasks (run: 5, or 6 with attribute)
    print(f"cached tasks: {tasks}{cached_note}   wall time: {summary['wall_s']:.1f} s")
    print(f"MLflow run {summary['mlflow_run_id']} (every difference: ttt-pipeline report {summary['mlflow_run_id']}); "
          f"open the UIs with:\n{ui_lines(summary['mlflow_tracking_uri'], run_link(summary))}")
    if summary.get("report"):  # an MLflow artifact: a file:// URI in a local store, a path one can open
        print(f"report (the reviews the noise flipped, fixed and broke): {summary['report'].removeprefix('file://')}")
    again = rerun_arguments(getattr(args, "model", None), args.config, args.set)
    summary["next_commands"] = next_commands(summary.get("registry"), again, _tracking_flag(summary),
                                             _program())
    print(next_lines(summary.get("registry"), summary["next_commands"]))
    status = gate.apply(summary, cfg, args)
    if args.json:
        sys.stdout.flush()
        print(json.dumps(summary, default=str))
    return status


def _tracking_flag(summary: dict) -> list[str]:
    """`--tracking-uri URI` for predict and serve where the run's MLflow store is not the one they open by default
    in this shell ($TTT_TRACKING_URI, $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)."""
    from ttt_pipeline.io.client import default_tracking_uri
    from ttt_pipeline.io.tracking import resolve_uri

    uri = summary["mlflow_tracking_uri"]
    return [] if resolve_uri(default_tracking_uri()) == resolve_uri(uri) else ["--tracking-uri", uri]


def _program() -> str:
    """`ttt-pipeline` as this environment has it (.venv/bin/ttt-pipeline), the way the UI lines spell mlflow."""
    from ttt_pipeline.cli.console import _bin

    return _bin("ttt-pipeline")


def cmd_evaluate(args) -> int:
    """A classifier fine-tuned elsewhere through the evaluate grid (the `evaluate-model` flow); no training."""
    from ttt_pipeline.cli.console import setup_run_logging
    from ttt_pipeline.cli.stopping import StopOnSignal
    from ttt_pipeline.config import absolute_paths, load_config
    from ttt_pipeline.errors import ConfigError

    cfg = load_config(args.config, args.set)
    if args.model:
        cfg.model.classifier = args.model
    if not cfg.model.classifier:
        raise ConfigError("no model to evaluate", "ttt-pipeline evaluate --model FOLDER_OR_MODELS_URI "
                          "(a Hugging Face folder, models:/NAME@ALIAS, runs:/RUN_ID/model or a hub id)")
    cfg = absolute_paths(cfg)
    gate.rules(args)  # a malformed --fail-if stops here, before any work
    _env_defaults(Path(cfg.store))
    setup_run_logging()
    with StopOnSignal(cfg):
        _say(f"checking the configuration, the data ({cfg.data.path}), MLflow and the model ({cfg.model.classifier})")
        data = preflight_model(cfg)
        _say("starting Prefect (a temporary local server unless PREFECT_API_URL names one)")
        start_prefect_server()
        from ttt_pipeline.flows.evaluate_model import evaluate_model

        summary = evaluate_model(config=cfg)
    from ttt_pipeline.cli.next_steps import overlap_note

    note = overlap_note(cfg.data, data.meta.get("test_from"), data.meta.get("sizes", {}).get("test"))
    summary["notes"] = [*(summary.get("notes") or []), *([note] if note else [])]  # said once, in the summary
    return _print_summary(summary, cfg, args)


def _say(text: str) -> None:
    """A progress line of the run command before Prefect's loggers take over (same look as the stage lines), on
    stdout: stderr of a run stopped in preflight holds only its `error:` and `hint:` lines."""
    import time

    print(f"{time.strftime('%H:%M:%S')}  {text}", flush=True)


EXIT_REGRESSION = 3


def cmd_reevaluate(args) -> int:
    """The nightly re-evaluation now: the same flow as the `nightly-reevaluation` deployment. Exit 0 when the
    champion holds up, 3 on a regression, 2 when there is no champion yet (with `error:` and `hint:`)."""
    from ttt_pipeline.cli.console import nightly_lines, setup_run_logging
    from ttt_pipeline.config import absolute_paths, load_config

    cfg = load_config(args.config, args.set)
    if args.model:
        cfg.model.classifier = args.model
    cfg = absolute_paths(cfg)
    if cfg.nightly.data_path:  # checked before any scoring: a missing file names nightly.data_path at once
        from ttt_pipeline.data.newdata import resolve

        resolve(cfg.nightly.data_path)
        if "://" not in cfg.nightly.data_path:
            cfg.nightly.data_path = str(Path(cfg.nightly.data_path).expanduser().resolve())
    _env_defaults(Path(cfg.store))
    setup_run_logging()
    _say(f"re-evaluating the champion of {cfg.data.path} under {cfg.evaluation.defense}")
    start_prefect_server()
    from ttt_pipeline.flows.reevaluate import nightly_reevaluation

    kwargs = {"threshold": args.threshold, "reference_seed": args.reference_seed, "night": args.night}
    state = nightly_reevaluation(config=cfg, return_state=True, **kwargs)
    summary = state.result(raise_on_failure=False)
    if isinstance(summary, BaseException):  # a crash, not an outcome: reported as any other error
        raise summary
    print("\n" + nightly_lines(summary))
    if args.json:
        sys.stdout.flush()
        print(json.dumps(summary, default=str))
    if summary["verdict"] == "no_champion":
        sys.stdout.flush()
        print(f"error: {summary['message']}\nhint: {summary['hint']}", file=sys.stderr)
        return EXIT_USER
    return EXIT_REGRESSION if summary["verdict"] == "regression" else 0


def cmd_config(args) -> int:
    from ttt_pipeline.config import PipelineConfig, dump_yaml, load_config

    if args.schema:
        print(json.dumps(PipelineConfig.model_json_schema(), indent=2))
        return 0
    cfg = load_config(args.config, args.set)
    print(dump_yaml(cfg.model_dump(mode="json")))
    return 0


def cmd_corrupt(args) -> int:
    from ttt_pipeline.cli import corrupt

    return corrupt.run(args)


def _preset_names() -> str:
    from ttt_pipeline.preset_files import preset_names  # not the schema: parsing must not import torch

    return ", ".join(preset_names())


def _config_help(what: str, default: str | None = "demo") -> str:
    """--config's help: the presets by name, what the configuration is for here, and the default."""
    fallback = default or "no preset: every field's default"
    return f"YAML file or preset name ({_preset_names()}): {what} (default: {fallback})"


def build_parser() -> argparse.ArgumentParser:
    from ttt_pipeline.version import __version__

    p = argparse.ArgumentParser(prog="ttt-pipeline", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"ttt-pipeline {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run the whole pipeline (download, tokenise, finetune, corrupt, evaluate)")
    r.add_argument("--config", default="demo", help=_config_help("the data, model, training, corruptions and "
                                                                "defenses"))
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field, e.g. finetune.epochs=2")
    r.add_argument("--json", action="store_true", help="print the summary as one JSON object on the last line")
    # SUPPRESS: without it the subcommand's default (False) overwrites a `ttt-pipeline --debug run`
    r.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    gate.add_arguments(r)
    r.set_defaults(fn=cmd_run)

    e = sub.add_parser("evaluate", help="score a classifier fine-tuned elsewhere (no training): the same grid, "
                       "defenses, intervals and MLflow run as `run`")
    e.add_argument("--model", default=None, metavar="MODEL", help="a Hugging Face sequence-classification folder, "
                   "models:/NAME@ALIAS, models:/NAME/VERSION, runs:/RUN_ID/model or a hub id (model.classifier)")
    e.add_argument("--config", default="demo", help=_config_help("the data, corruptions and defenses; each "
                                                                 "preset's task, labels and data: below"))
    e.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field, e.g. 'model.label_map={LABEL_0: negative, LABEL_1: positive}' or "
                   "ttt.mlm_from=bert-base-uncased")
    e.add_argument("--json", action="store_true", help="print the summary as one JSON object on the last line")
    e.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    gate.add_arguments(e)
    e.set_defaults(fn=cmd_evaluate)
    from ttt_pipeline.cli.preset_help import add_presets_table

    add_presets_table(e)

    n = sub.add_parser("reevaluate", help="re-evaluate the registered champion now (the nightly flow): verdict "
                       "ok / regression / no_champion")
    n.add_argument("--config", default="demo", help=_config_help("the champion's task"))
    n.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field, e.g. nightly.data_path=new/reviews.jsonl")
    n.add_argument("--model", default=None, metavar="MODEL", help="the classifier brought with `evaluate --model "
                   "MODEL`: judge its registered champion instead of the pipeline-trained one's")
    n.add_argument("--threshold", type=float, default=0.02, help="the alarm's threshold (accuracy fraction)")
    n.add_argument("--reference-seed", type=int, default=42, help="seed of the fixed reference suite")
    n.add_argument("--night", default=None, help="the night's date YYYY-MM-DD (default: today)")
    n.add_argument("--json", action="store_true", help="print the outcome as one JSON object on the last line")
    n.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    n.set_defaults(fn=cmd_reevaluate)

    c = sub.add_parser("config", help="print the resolved configuration (or its JSON schema)")
    c.add_argument("--config", default=None, help=_config_help("the configuration to print", None))
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field, as `run --set` would, e.g. finetune.epochs=2 (repeatable)")
    c.add_argument("--schema", action="store_true", help="print the JSON schema of every field (types, defaults, "
                   "descriptions) instead of a configuration")
    c.set_defaults(fn=cmd_config)

    k = sub.add_parser("corrupt", help="list corruption families or corrupt a file of texts (one per line)")
    from ttt_pipeline.cli import corrupt

    corrupt.add_arguments(k)
    k.set_defaults(fn=cmd_corrupt)
    from ttt_pipeline.cli import alerts, monitor, predict, serve

    predict.add_command(sub)
    serve.add_commands(sub)
    alerts.add_command(sub)
    monitor.add_command(sub, _config_help)
    _add_run_inspection(sub)
    return p


def _add_run_inspection(sub) -> None:
    try:
        from ttt_pipeline.cli import runs
    except ImportError:
        return
    runs.add_commands(sub)
    from ttt_pipeline.cli import explain

    explain.add_command(sub)  # `explain RUN_ID --example N`: the attribute stage's training reviews


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _few_malloc_arenas()  # before any thread starts
    _system_arrow_pool()  # before pyarrow loads
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("TTT_DEBUG") == "1"
    try:
        return args.fn(args)
    except PipelineError as exc:
        if debug:
            raise
        print(f"error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return EXIT_USER
    except KeyboardInterrupt:
        print("interrupted: cached steps are kept; run the same command again to resume", file=sys.stderr)
        return 130
    except Exception as exc:
        if debug:
            raise
        print(f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", file=sys.stderr)
        print("hint: this looks like a bug; re-run with --debug for the traceback and report it", file=sys.stderr)
        return EXIT_BUG


if __name__ == "__main__":
    sys.exit(main())
