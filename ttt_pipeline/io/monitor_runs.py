"""The traffic monitor's MLflow side: the model version a window is judged as, its calibration and label names,
and one monitoring run per model version that every window adds a step to.

The run is found by its tags (ttt_run_kind = traffic-monitor, registered_model, model_version) and created on the
version's first window. Each window's figures (`monitoring.metrics`) are logged with `step` = the window's end in
epoch seconds and that time as their timestamp, so the MLflow UI's charts draw the trend over time; the plot
`traffic_forecast.png` (forecast drop with its interval and the baselines over time, beside max_drop) is redrawn
from the run's metric history and logged again each window. The run is marked FINISHED after each window (MLflow
logs to a finished run; its end time is the last window's).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import tempfile
from pathlib import Path
from typing import Mapping

from ttt_pipeline.errors import PipelineError
from ttt_pipeline.io.tracking import Tracker, retry

RUN_KIND = "traffic-monitor"
PLOT = "traffic_forecast.png"
SERIES = ("forecast_drop", "forecast_drop_ci_low", "forecast_drop_ci_high", "baseline_ac", "baseline_doc",
          "baseline_atc")
log = logging.getLogger(__name__)


def model_version(client, name: str, version: str):
    """The registered ModelVersion, or None when traffic names a model the registry does not hold (`unknown`, a
    run id)."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version(name, str(version))
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise


def read_calibration_file(path: str | Path) -> dict:
    """A calibration payload from a JSON file ({"calibration": ..., "reference": ...}, as the calibration store
    returns it, or a bare Calibration.to_dict())."""
    p = Path(path).expanduser()
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PipelineError(f"calibration file {p}: cannot read it as JSON ({exc})",
                            "give the JSON file of a model's calibration") from None
    if not isinstance(data, dict):
        raise PipelineError(f"calibration file {p}: not a JSON object", "give the JSON file of a model's calibration")
    return data if "calibration" in data else {"calibration": data, "reference": {}}


def calibration_for(client, mv, path: str | Path | None = None) -> dict | None:
    """The calibration payload to judge with: the file at `path` when given, else the one stored with the model
    version (io.calibration_store.load_calibration); None when there is none."""
    if path:
        return read_calibration_file(path)
    if mv is None:
        return None
    from ttt_pipeline.io.calibration_store import load_calibration

    return load_calibration(client, mv)


def label_names(client, mv, tracking_uri: str) -> list[str] | None:
    """The model version's class names, from its MLmodel's metadata (one small download); None when unknown."""
    import mlflow.artifacts
    import yaml

    if mv is None:
        return None
    try:
        location = client.get_model_version_download_uri(mv.name, mv.version)
        with tempfile.TemporaryDirectory(prefix="ttt-mlmodel-") as tmp:
            got = mlflow.artifacts.download_artifacts(artifact_uri=f"{location.rstrip('/')}/MLmodel", dst_path=tmp,
                                                      tracking_uri=tracking_uri)
            spec = yaml.safe_load(Path(got).read_text(encoding="utf-8")) or {}
        names = (spec.get("metadata") or {}).get("label_names")
        return [str(n) for n in names] if names else None
    except Exception as exc:  # an MLmodel of another kind, an unreachable store: no label shares against names
        log.warning("could not read the label names of %s v%s: %s", mv.name, mv.version, exc)
        return None


def monitoring_run(tracker: Tracker, model_name: str, version: str) -> str:
    """The version's monitoring run (the oldest, should two monitors have raced), created on first use."""
    runs = tracker.client.search_runs(
        [tracker.experiment_id], f"tags.ttt_run_kind = '{RUN_KIND}' and tags.registered_model = '{model_name}' "
        f"and tags.model_version = '{version}'", order_by=["attribute.start_time ASC"], max_results=1)
    if runs:
        return runs[0].info.run_id
    return tracker.start(f"traffic-{model_name}-v{version}", tags={
        "ttt_run_kind": RUN_KIND, "registered_model": model_name, "model_version": str(version),
        "mlflow.note.content": f"Traffic of {model_name} v{version}: one step per monitored window (step = the "
                               "window's end, epoch seconds). Plot: traffic_forecast.png."})


def log_window(tracker: Tracker, run_id: str, figures: Mapping[str, float], summary: Mapping,
               end: dt.datetime) -> None:
    """The window's figures at step = its end (epoch seconds), the last verdict as tags, the plot redrawn."""
    from mlflow.entities import Metric, RunTag

    ms, step = int(end.timestamp() * 1000), int(end.timestamp())
    items = [Metric(k, float(v), ms, step) for k, v in figures.items() if v == v]
    tags = [RunTag("last_verdict", summary["verdict"]), RunTag("last_window_end", end.isoformat()),
            RunTag("last_window", summary["window"]["duration"])]
    for i in range(0, len(items), 900):
        chunk = items[i:i + 900]
        retry(lambda c=chunk: tracker.client.log_batch(run_id, metrics=c, tags=tags), "log the window")
    try:
        _log_plot(tracker, run_id, summary)
    except Exception as exc:  # the plot is a view of the metrics, which are logged
        log.warning("traffic monitor: could not redraw %s of run %s: %s", PLOT, run_id, exc)
    tracker.end(run_id, "FINISHED")


def history(client, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """SERIES -> [(step, value), ...] by step, from the run's metric history."""
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) for key in SERIES}


def forecast_figure(series: Mapping[str, list[tuple[int, float]]], max_drop: float, title: str):
    """Forecast drop (points) over the windows' ends, its interval as a band, the baselines as thin lines and
    max_drop as a dashed line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 3.6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()

    def when(points):
        return [dt.datetime.fromtimestamp(s, dt.timezone.utc) for s, _ in points]

    main, low, high = (series.get(k) or [] for k in SERIES[:3])
    if main:
        ax.plot(when(main), [100 * v for _, v in main], marker="o", color="#1f77b4", label="forecast drop")
    if low and high and len(low) == len(high):
        ax.fill_between(when(low), [100 * v for _, v in low], [100 * v for _, v in high], color="#1f77b4",
                        alpha=0.2, label="interval")
    for key, color in (("baseline_ac", "#7f7f7f"), ("baseline_doc", "#bcbd22"), ("baseline_atc", "#17becf")):
        if series.get(key):
            ax.plot(when(series[key]), [100 * v for _, v in series[key]], lw=0.8, color=color,
                    label=key.removeprefix("baseline_").upper())
    ax.axhline(100 * max_drop, ls="--", color="#d62728", lw=1, label="max_drop")
    ax.set_ylabel("accuracy drop (points)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    fig.autofmt_xdate()
    return fig


def _log_plot(tracker: Tracker, run_id: str, summary: Mapping) -> None:
    fig = forecast_figure(history(tracker.client, run_id), summary["max_drop"],
                          f"{summary['model_name']} v{summary['model_version']}: forecast accuracy drop of its traffic")
    with tempfile.TemporaryDirectory(prefix="ttt-traffic-plot-") as tmp:
        fig.savefig(Path(tmp) / PLOT)
        tracker.artifact(run_id, Path(tmp) / PLOT)
