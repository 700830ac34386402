"""`traffic-monitor`: what does today's unlabelled traffic cost the served model in accuracy?

Every hour (the deployment in prefect.yaml; `ttt-pipeline monitor` runs the same from a terminal): drop the traffic
store's partitions older than monitoring.retention_days, read the window of captured traffic (monitoring.window,
ending at the scheduled start) with DuckDB (`io/traffic_window.py`), judge it as the model version that served most
of it against that version's calibration (`io/monitor_runs.py`; `ttt_pipeline/monitoring.py` decides), add the
window's figures as one step to the version's monitoring run in MLflow, and emit the verdict as a Prefect event
(`ttt.traffic.ok`, `ttt.traffic.noisy`, `ttt.traffic.no-traffic`; `ttt-pipeline alerts apply` notifies on noisy).
A noisy window ends the run in state "Noisy" (a completed type: the check itself worked). This module only wires.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from prefect import flow, get_run_logger
from prefect.states import Completed

from ttt_pipeline import monitoring
from ttt_pipeline.config import PipelineConfig, flow_config
from ttt_pipeline.errors import ConfigError
from ttt_pipeline.evaluation.forecast import Calibration
from ttt_pipeline.events import TRAFFIC, emit_traffic
from ttt_pipeline.flows.forms import name_presets
from ttt_pipeline.io import monitor_runs
from ttt_pipeline.io.tracking import Tracker
from ttt_pipeline.io.traffic_window import enforce_retention, read_window


def _model_name(cfg: PipelineConfig, model_name: str | None) -> str | None:
    """The model to judge: the one asked for, else the configuration's registered model (when its labels are
    known), else None (then the window must hold one model only)."""
    if model_name:
        return model_name
    try:
        return cfg.model_name()
    except ConfigError:
        return None


def _judged(cfg, tracker: Tracker, uri: str, bounds, name: str, version: str, calibration_path: str | None):
    """(read, window descriptors, judgement, calibration) of one model version's records in the window."""
    mv = monitor_runs.model_version(tracker.client, name, version)
    payload = monitor_runs.calibration_for(tracker.client, mv, calibration_path)
    cal = Calibration.from_dict(payload["calibration"]) if payload else None
    reference = (payload or {}).get("reference") or {}
    threshold = cal.atc_threshold if cal is not None else None
    read = read_window(uri, *bounds, model_name=name, model_version=version, threshold=threshold)
    read["threshold"] = threshold
    labels = (reference.get("label_names") or monitor_runs.label_names(tracker.client, mv, tracker.uri)
              or sorted(read["labels"]))
    window = monitoring.window_descriptors(read, labels, reference)
    return read, window, monitoring.judge(cal, window, cfg.monitoring.max_drop, cfg.monitoring.min_records), cal


def check_traffic(cfg: PipelineConfig, window: str | None = None, end: dt.datetime | str | None = None,
                  model_name: str | None = None, calibration_path: str | None = None) -> dict:
    """One window judged and logged: the summary (`monitoring.summary`), with the monitoring run's id."""
    mon = cfg.monitoring
    duration = window or mon.window
    bounds = monitoring.window_bounds(duration, end)
    uri = monitoring.traffic_location(mon.traffic_uri)
    name = _model_name(cfg, model_name)
    first = read_window(uri, *bounds, model_name=name)
    if not first["n"]:
        out = monitoring.no_traffic_summary(bounds, duration, name, mon.max_drop, mon.min_records, first, uri)
        return {**out, "mlflow_run_id": None}
    name = name or monitoring.only_model(first["model_versions"])
    version, others = monitoring.pick_version(first["model_versions"][name])
    tracker = Tracker.from_config(cfg.tracking)
    tracker.check()
    read, described, judged, cal = _judged(cfg, tracker, uri, bounds, name, version, calibration_path)
    out = monitoring.summary(judged=judged, window=described, model_name=name, model_version=version,
                             other_versions=others, bounds=bounds, duration=duration, max_drop=mon.max_drop,
                             min_records=mon.min_records, read=read, calibration=cal, traffic_uri=uri)
    run_id = monitor_runs.monitoring_run(tracker, name, version)
    monitor_runs.log_window(tracker, run_id, monitoring.metrics(out), out, bounds[1])
    return {**out, "mlflow_run_id": run_id}


def run_monitor(cfg: PipelineConfig, window: str | None = None, end: dt.datetime | str | None = None,
                model_name: str | None = None, calibration_path: str | None = None, emit: bool = True) -> dict:
    """Retention, the window's check and its event (`emit` false: named, not sent): what the flow and
    `ttt-pipeline monitor` run."""
    removed = enforce_retention(monitoring.traffic_location(cfg.monitoring.traffic_uri),
                                cfg.monitoring.retention_days, monitoring.utc(end))
    out = check_traffic(cfg, window, end, model_name, calibration_path)
    out["retention_removed"] = removed
    out["event"] = (emit_traffic(out["verdict"], out["model_name"], monitoring.event_payload(out)) if emit else
                    {"name": TRAFFIC[out["verdict"]], "id": None})
    return out


# No retries: a window judged twice would log the same step twice; the next hour's run comes anyway.
@flow(name="traffic-monitor", retries=0)
@name_presets
def traffic_monitor(config: PipelineConfig | None = None, preset: str | None = None,
                    overrides: dict[str, Any] | None = None, window: str | None = None, end: str | None = None,
                    model_name: str | None = None, calibration: str | None = None):
    """Judge the window of captured traffic ending now (the scheduled start): verdict ok, noisy or no_traffic, each
    with its event; a noisy window ends in state "Noisy".

    Args:
        config: The whole configuration (what the command line passes); when given, preset is not read.
        preset: The served model's task: a preset by name (PRESET_NAMES) or a YAML file on the worker; empty: demo.
        overrides: Fields set on top, e.g. {"monitoring.traffic_uri": "s3://bucket/traffic"}.
        window: The window's duration (30m, 24h, 7d); empty: monitoring.window.
        end: The window's end, ISO-8601 (re-judge a past window); empty: the scheduled start, else now.
        model_name: The registered model whose traffic is judged; empty: the configuration's.
        calibration: A calibration JSON file on the worker; empty: the one stored with the model version.
    """
    from prefect.runtime import flow_run

    cfg = flow_config(config, preset, overrides)
    when = end or (flow_run.get_scheduled_start_time() if flow_run.get_id() else None)
    out = run_monitor(cfg, window, when, model_name, calibration)
    logger = get_run_logger()
    logger.info(monitoring.console_line(out))
    for part in out["skipped_parts"]:
        logger.warning("skipped an unreadable traffic part: %s", part)
    if out["verdict"] == "noisy":
        return Completed(name="Noisy", data=out, message=monitoring.console_line(out))
    return out
