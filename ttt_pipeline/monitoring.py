"""The traffic monitor's decisions, with no Prefect, no MLflow and no store: which window, which model version, the
window's label-free descriptors against the reference, the forecast drop with its interval, the confidence
baselines, the verdict and the summary that the flow returns, `ttt-pipeline monitor --json` prints and the event
carries. `flows/monitor.py` wires them to the traffic store (`io/traffic_window.py`, DuckDB) and to MLflow
(`io/monitor_runs.py`).

A window's figures are computed from the store's sums (evaluation.descriptors.window_from_sums): the mean of each
per-text descriptor, the mean top-class probability, the share of predictions the default defense changed (the
records whose `raw_label`, the prediction on the unrepaired text, differs from the served label), the predicted
label shares and their total variation from the test set's, and the share above the calibration's ATC threshold.
The forecast (evaluation.forecast) reads them against the calibration stored with the model.

Verdicts: `no_traffic` (fewer than monitoring.min_records records: too few to judge, exit 0), `ok`, `noisy` (the
whole forecast interval lies above monitoring.max_drop: exit EXIT_NOISY, as `reevaluate` exits on a regression).
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Mapping, Sequence

from ttt_pipeline.config.schema import WINDOW_PATTERN
from ttt_pipeline.defenses import registry
from ttt_pipeline.errors import ConfigError, PipelineError
from ttt_pipeline.evaluation.descriptors import PER_TEXT, window_from_sums
from ttt_pipeline.evaluation.forecast import Calibration, baseline_drops, forecast, verdict

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DEFAULT_REPAIR = "spell"  # the descriptors' repair when the model's default defense has none
EXIT_NOISY = 3
EVENT_DESCRIPTORS = ("oov_words_share", "repaired_words_share", "non_letter_character_share", "foreign_script_share",
                     "defense_change_rate", "mean_confidence", "label_share_shift")


def parse_window(text: str) -> dt.timedelta:
    """`30m`, `24h`, `7d`, `2w`, `90s` -> the duration; anything else a ConfigError naming the forms."""
    value = str(text).strip()
    if not re.fullmatch(WINDOW_PATTERN, value):
        raise ConfigError(f"window {text!r} is not a duration", "give a whole number and a unit: 30m, 24h, 7d (s, "
                          "m, h, d or w)")
    return dt.timedelta(seconds=int(value[:-1]) * UNITS[value[-1]])


def utc(when: dt.datetime | str | None, now: dt.datetime | None = None) -> dt.datetime:
    """A timezone-aware UTC datetime from an ISO-8601 text or a datetime (a naive one is taken as UTC); None: now."""
    if when is None:
        when = now or dt.datetime.now(dt.timezone.utc)
    if isinstance(when, str):
        try:
            when = dt.datetime.fromisoformat(when.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(f"end {when!r} is not an ISO-8601 time",
                              "give e.g. 2024-05-01T12:00:00Z (a time without an offset is UTC)") from None
    if when.tzinfo is None or when.utcoffset() is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.astimezone(dt.timezone.utc)


def window_bounds(window: str, end: dt.datetime | str | None = None,
                  now: dt.datetime | None = None) -> tuple[dt.datetime, dt.datetime]:
    """[start, end) of the window of duration `window` that ends at `end` (default: now), in UTC."""
    stop = utc(end, now)
    return stop - parse_window(window), stop


def traffic_location(uri: str) -> str:
    """The store as every process reads it: a local folder made absolute (taken from the current folder once, as
    the configuration's other paths are), a URL as it is."""
    return uri if "://" in uri else str(Path(uri).expanduser().resolve())


def descriptor_method(method: str) -> str:
    """The repair the descriptors measure `repaired_words_share` with: the repairs of the model's default defense
    (`spell+masked_ttt` -> `spell`), else DEFAULT_REPAIR, so the share is measured whatever the defense; a
    calibration must measure its sets with the same repair."""
    repairs = list(registry.parse(method).repairs) or [DEFAULT_REPAIR]
    return "+".join(repairs)


def only_model(model_versions: Mapping[str, Mapping[str, int]]) -> str:
    """The one model a window holds records of; a PipelineError naming them when there are several."""
    if len(model_versions) != 1:
        names = ", ".join(f"{n} ({sum(v.values())} records)" for n, v in sorted(model_versions.items()))
        raise PipelineError(f"the traffic window holds records of several models: {names}",
                            "name the model to judge with --model NAME (monitor's model_name parameter)")
    return next(iter(model_versions))


def pick_version(versions: Mapping[str, int]) -> tuple[str, dict[str, int]]:
    """(the version with the most records in the window, ties to the highest; the other versions' counts): a
    window across a champion switch is judged as the version that served most of it."""
    def key(item):
        version, n = item
        return n, (1, int(version)) if version.isdigit() else (0, version)

    chosen = max(versions.items(), key=key)[0]
    return chosen, {v: n for v, n in sorted(versions.items()) if v != chosen}


def reference_shares(reference: Mapping | None, label_names: Sequence[str]) -> list[float] | None:
    """The test set's predicted label shares in `label_names` order, from a calibration's reference: a mapping
    label -> share, or a list in the order of the reference's own `label_names` (else the model's)."""
    shares = (reference or {}).get("label_shares")
    if shares is None or not label_names:
        return None
    if isinstance(shares, Mapping):
        return [float(shares.get(name, 0.0)) for name in label_names]
    names = list((reference or {}).get("label_names") or label_names)
    if len(names) != len(shares):
        return None
    by_name = dict(zip(names, shares))
    return [float(by_name.get(name, 0.0)) for name in label_names]


def window_descriptors(read: Mapping, label_names: Sequence[str], reference: Mapping | None = None) -> dict:
    """A window's descriptors from the store's aggregates (`io.traffic_window.read_window`'s dict), with its label
    shares by name and against the reference's (`reference_shares`)."""
    n = int(read["n"])
    sums = {name: float(read["sums"][name] or 0.0) for name in PER_TEXT if name in read["sums"]}
    sums["confidence"] = float(read["mean_probability"] or 0.0) * n
    sums["label_counts"] = [int(read["labels"].get(name, 0)) for name in label_names]
    sums["changed_predictions"] = int(read.get("raw_label_changed") or 0)
    if read.get("above_threshold") is not None and read.get("threshold") is not None:
        sums["threshold"], sums["above_threshold"] = float(read["threshold"]), int(read["above_threshold"])
    window = window_from_sums(sums, n, reference_shares(reference, label_names))
    if window["label_shares"] is not None:
        window["label_shares"] = dict(zip(label_names, window["label_shares"]))
    return window


def judge(calibration: Calibration | None, window: Mapping, max_drop: float, min_records: int) -> dict:
    """{"verdict", "forecast_drop", "baselines"}: the forecast and baselines whenever the window holds records and
    a calibration is given; a window of min_records or more needs one (a PipelineError says how to get one)."""
    n = int(window["n"])
    fc = baselines = None
    if n and calibration is not None:
        fc = forecast(calibration, window)
        baselines = baseline_drops(calibration, window)
    if n >= min_records and calibration is None:
        raise PipelineError("the model has no forecast calibration, so its traffic's accuracy drop cannot be "
                            "forecast", "run the pipeline on it (its evaluation stores the calibration with the "
                            "model) or pass --calibration FILE")
    return {"verdict": verdict(fc, max_drop, n, min_records), "forecast_drop": fc, "baselines": baselines}


def calibration_facts(calibration: Calibration | None) -> dict | None:
    """What a summary says of the calibration: its model, families, confidence and held-out errors."""
    if calibration is None:
        return None
    return {"model": calibration.model, "families": list(calibration.families), "confidence": calibration.confidence,
            "held_out_error": calibration.held_out_errors.get(calibration.model),
            "baseline_errors": dict(calibration.baseline_errors), "test_accuracy": calibration.test_accuracy}


def baseline_note(calibration: Calibration | None) -> str | None:
    """Where a confidence baseline beat the forecast on the calibration's held-out families, say so."""
    if calibration is None or not calibration.baseline_errors:
        return None
    own = calibration.held_out_errors.get(calibration.model)
    best, err = min(calibration.baseline_errors.items(), key=lambda kv: kv[1])
    if own is None or err >= own:
        return None
    return (f"on the calibration's held-out families the {best.upper()} baseline erred less ({100 * err:.2f} points "
            f"mean absolute) than the forecast ({100 * own:.2f}): read baselines.{best} beside forecast_drop")


def summary(*, judged: Mapping, window: Mapping | None, model_name: str | None, model_version: str | None,
            other_versions: Mapping[str, int], bounds: tuple[dt.datetime, dt.datetime], duration: str,
            max_drop: float, min_records: int, read: Mapping | None, calibration: Calibration | None,
            traffic_uri: str) -> dict:
    """The check's result: the JSON contract of `ttt-pipeline monitor --json` and the flow's return value."""
    start, end = bounds
    return {"verdict": judged["verdict"], "n": int(window["n"]) if window else 0,
            "model_name": model_name, "model_version": model_version, "other_versions": dict(other_versions),
            "window": {"start": start.isoformat(), "end": end.isoformat(), "duration": duration},
            "forecast_drop": judged["forecast_drop"], "baselines": judged["baselines"],
            "descriptors": dict(window) if window else None, "max_drop": max_drop, "min_records": min_records,
            "truncated": int(read["truncated"]) if read else 0,
            "skipped_parts": list(read["skipped_parts"]) if read else [],
            "calibration": calibration_facts(calibration), "note": baseline_note(calibration),
            "traffic_uri": traffic_uri}


def no_traffic_summary(bounds: tuple[dt.datetime, dt.datetime], duration: str, model_name: str | None,
                       max_drop: float, min_records: int, read: Mapping, traffic_uri: str) -> dict:
    """The summary of a window without a record (of the model asked for, when one is)."""
    return summary(judged={"verdict": "no_traffic", "forecast_drop": None, "baselines": None}, window=None,
                   model_name=model_name, model_version=None, other_versions={}, bounds=bounds, duration=duration,
                   max_drop=max_drop, min_records=min_records, read=read, calibration=None, traffic_uri=traffic_uri)


def points(fc: Mapping | None) -> str | None:
    """A forecast in accuracy points, as alerts and the console show it: `+8.10 [+5.02, +11.30]`."""
    if fc is None:
        return None
    return f"{100 * fc['delta']:+.2f} [{100 * fc['ci_low']:+.2f}, {100 * fc['ci_high']:+.2f}]"


def event_payload(s: Mapping) -> dict:
    """What the verdict's event carries: what an alert names, the forecast as fractions and as points."""
    descriptors = s.get("descriptors") or {}
    return {"verdict": s["verdict"], "model_name": s["model_name"], "model_version": s["model_version"],
            "n": s["n"], "window": s["window"], "forecast_drop": s["forecast_drop"],
            "forecast_points": points(s["forecast_drop"]), "max_drop": s["max_drop"],
            "max_drop_points": f"{100 * s['max_drop']:.2f}", "baselines": s["baselines"],
            "descriptors": {k: descriptors.get(k) for k in EVENT_DESCRIPTORS},
            "mlflow_run_id": s.get("mlflow_run_id")}


def metrics(s: Mapping) -> dict[str, float]:
    """The window's figures as MLflow metrics (one step per window): n, noisy (1/0), the forecast and its interval,
    the baselines and every scalar descriptor."""
    out: dict[str, float] = {"n": float(s["n"]), "noisy": float(s["verdict"] == "noisy"),
                             "max_drop": float(s["max_drop"])}
    if s["forecast_drop"]:
        out.update({f"forecast_drop{'' if k == 'delta' else '_' + k}": float(v) for k, v in s["forecast_drop"].items()})
    for k, v in (s["baselines"] or {}).items():
        if v is not None:
            out[f"baseline_{k}"] = float(v)
    for k, v in (s["descriptors"] or {}).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "n":
            out[k] = float(v)
    for label, share in ((s["descriptors"] or {}).get("label_shares") or {}).items():
        out[f"label_share/{label}"] = float(share)
    return out


def exit_code(verdict_name: str) -> int:
    return EXIT_NOISY if verdict_name == "noisy" else 0


def console_line(s: Mapping) -> str:
    """One line for the terminal and the flow's log."""
    where = f"{s['model_name']} v{s['model_version']}" if s["model_version"] else (s["model_name"] or "any model")
    head = f"traffic {s['window']['start']} .. {s['window']['end']} ({s['window']['duration']}), {where}: "
    if s["verdict"] == "no_traffic":
        return head + f"no_traffic ({s['n']} records, fewer than {s['min_records']})"
    fc = s["forecast_drop"]
    return head + (f"{s['verdict']}: {s['n']} records, forecast drop {points(fc)} points "
                   f"against max {100 * s['max_drop']:.2f}")
