"""`nightly-reevaluation`: does the registered champion still hold up under its recommended defense?

Every night: load the model version at alias `champion` of the task's registered model (`PipelineConfig.model_name`:
one per dataset and label set), draw the corruption suite with that night's seed (from the date) and with the fixed
reference seed, and score both without and with the recommended defense (`evaluation.default_defense`, the one
source: `none` when it is null). Robust accuracy is the corrupted-set accuracy under that defense on the
*reference* suite (the same texts every night, so a drop is the model's or the code's, not the seed's); the
night's fresh suite is logged beside it. With `nightly.data_path`, the champion is also scored on labelled
reviews that arrived since training, with and without its defense, against its test accuracy (Newcombe
interval) and with a drift summary (ttt_pipeline/tasks/nightly.py).

The alarm is paired: tonight's per-review predictions on the reference suite against the previous night's (or,
on the first night, the champion's own pipeline run's: the same reviews) give the change with a 95% bootstrap
interval. Only a change whose whole interval lies below -`threshold` is a regression; `min_detectable_drop` says
how large a drop the suite's size lets it see.

Outcomes, each a Prefect event with the figures in its payload (ttt_pipeline/tasks/nightly.py) and a final state of its own:
`ttt.nightly.ok` (Completed), `ttt.nightly.regression` (state "Regression", failed type: the MLflow run ends
FAILED with tag regression=true, the markdown artifact is flagged) and `ttt.nightly.no-champion` (state
"NoChampion", failed type, no retries, an artifact that says what to do). A crash stays plain Failed. The same
flow is the command `ttt-pipeline reevaluate`.
"""

from __future__ import annotations

import datetime as dt
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.states import Failed

from ttt_pipeline import steps
from ttt_pipeline.config import PipelineConfig, absolute_paths, flatten, flow_config
from ttt_pipeline.errors import PipelineError
from ttt_pipeline.evaluation.scoring import headline, metric_name
from ttt_pipeline.evaluation.stats import min_detectable_drop
from ttt_pipeline.flows.forms import name_presets
from ttt_pipeline.flows.stages import evaluate_on_gpu, run_task
from ttt_pipeline.io.remote_store import open_store
from ttt_pipeline.io.tracking import Tracker
from ttt_pipeline.tasks import corrupt_task, download_task, evaluate_task
from ttt_pipeline.tasks.nightly import emit_outcome, new_data_task

RUN_KIND = "nightly-reevaluation"
REF_PREDICTIONS = "predictions_ref.parquet"
ALIAS = "champion"


class NoChampion(PipelineError):
    """No model version holds the `champion` alias yet: there is nothing to re-evaluate."""


def night_of(scheduled: dt.datetime | None = None) -> str:
    """The night's date (YYYY-MM-DD): the scheduled start's own date, else today's."""
    when = scheduled or dt.datetime.now().astimezone()
    return when.date().isoformat()


def seed_for(night: str) -> int:
    """A different, reproducible corruption seed each night: the date's digits (YYYY-MM-DD -> YYYYMMDD)."""
    return int(night.replace("-", ""))


def load_champion(client, name: str):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, ALIAS)
    except MlflowException as exc:
        # no such model (RESOURCE_DOES_NOT_EXIST) or no such alias (INVALID_PARAMETER_VALUE); anything else is
        # not "no champion" and is raised as it is
        if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
        raise NoChampion(f"registered model {name!r} has no version at alias {ALIAS!r}: no champion yet, "
                         "nothing to re-evaluate",
                         "run the ttt-pipeline deployment once (registry.enabled: true, the default, registers its "
                         "model and makes the first one the champion), or set registry.model_name to the model "
                         "it registers") from None


def _no_champion_report(exc: NoChampion, tracking_uri: str, night: str) -> str:
    from ttt_pipeline.errors import redact

    return (f"# ⏸ No champion yet: nothing was re-evaluated\n\n"
            f"Night {night}: {exc.message} (MLflow at `{redact(tracking_uri)}`).\n\n"
            f"**What to do:** {exc.hint[0].upper()}{exc.hint[1:]}. Deployments → `ttt-pipeline` → Run starts it "
            f"with the same default configuration as this flow; once it has finished, the next night (or a run "
            f"started now) re-evaluates its model.\n\n"
            f"This run fails once, without retries: a retry would find no champion either.\n")


def _model_root(folder: Path) -> Path:
    from ttt_pipeline.modeling.layout import is_model_folder

    for meta in sorted(Path(folder).rglob("meta.json"), key=lambda p: len(p.parts)):
        if is_model_folder(meta.parent):
            return meta.parent
    raise PipelineError(f"no saved classifier (meta.json + head.safetensors or classifier/) under {folder}",
                        "the champion's source must be the `model` artifact logged by the fine-tune or "
                        "import-model stage")


def fetch_champion(tracker: Tracker, store, mv) -> dict:
    """The champion's model folder as a StepOutput in the store (downloaded once per model version)."""
    import mlflow.artifacts

    inputs = {"model_name": mv.name, "version": str(mv.version), "run_id": mv.run_id, "source": mv.source}

    def build(tmp: Path) -> dict:
        dl = tmp.parent / f".{tmp.name}.download"
        dl.mkdir()
        try:
            try:
                got = mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=str(dl),
                                                          tracking_uri=tracker.uri)
            except Exception:
                if not mv.run_id:
                    raise
                got = tracker.client.download_artifacts(mv.run_id, "model", str(dl))
            _model_root(Path(got)).rename(tmp / "model")
        finally:
            import shutil

            shutil.rmtree(dl, ignore_errors=True)
        return dict(inputs)

    return store.run("champion", inputs, build, "1").to_dict()


def previous_night(tracker: Tracker, model_name: str, night: str):
    runs = tracker.client.search_runs(
        [tracker.experiment_id],
        f"tags.ttt_run_kind = '{RUN_KIND}' and tags.registered_model = '{model_name}'",
        order_by=["attribute.start_time DESC"], max_results=50)
    for r in runs:
        if r.data.tags.get("night", "") < night and "robust_acc_ref" in r.data.metrics:
            return r
    return None


def training_predictions(tracker: Tracker, mv):
    """The champion's own pipeline run's per-review predictions (its evaluate stage), or None."""
    from ttt_pipeline.io.runs import run_predictions

    parent = (mv.tags or {}).get("parent_run_id")
    try:
        if not parent:
            parent = tracker.client.get_run(mv.run_id).data.tags.get("mlflow.parentRunId")
        return run_predictions(tracker.client, tracker.client.get_run(parent)) if parent else None
    except Exception:  # a deleted run, an older run without predictions: no paired baseline
        return None


def compare_nights(tracker: Tracker, prev, tonight, threshold: float, cfg, defense: str, mv=None) -> dict | None:
    """Tonight minus a baseline on the reference suite's reviews (ttt_pipeline.evaluation.robustness), paired:
    the previous night, else (`mv` given) the champion's pipeline run. None when the baseline stored no
    predictions or scored other reviews. `against` says which baseline it was."""
    import pandas as pd

    from ttt_pipeline.evaluation.robustness import regression_between

    previous, against = None, None
    if prev is not None:
        with tempfile.TemporaryDirectory(prefix="ttt-prev-") as tmp:
            try:
                previous = pd.read_parquet(tracker.client.download_artifacts(prev.info.run_id, REF_PREDICTIONS, tmp))
                against = f"previous night {prev.data.tags.get('night')} (MLflow run {prev.info.run_id})"
            except Exception:  # a night logged before predictions were kept: no paired comparison
                previous = None
    elif mv is not None and (previous := training_predictions(tracker, mv)) is not None:
        against = f"the champion's pipeline run (v{mv.version}, training time)"
    if previous is None:
        return None
    ev = cfg.evaluation
    check = regression_between(previous, tonight, defense, threshold, resamples=ev.resamples,
                               confidence=ev.confidence, seed=ev.seed)
    return None if check is None else {**check, "against": against}


def _report(night: str, mv, now: dict, prev, threshold: float, regression: bool, run_link: str,
            defense: str, extra: dict) -> str:
    def f(v):
        return "-" if v is None else f"{v:.3f}"

    head = (f"# ❌ REGRESSION — `{defense}` robust accuracy fell significantly by more than {100 * threshold:.1f} "
            "points\n\n" if regression else f"# ✅ Nightly re-evaluation of `{defense}`: no regression\n\n")
    rows = [("clean accuracy", "acc_clean"), (f"clean accuracy with {defense}", "acc_clean_ttt"),
            ("reference suite, corrupted", "acc_corrupted_ref"),
            (f"reference suite, with {defense} (robust)", "robust_acc_ref"),
            ("tonight's suite, corrupted", "acc_corrupted_night"), (f"tonight's suite, with {defense}", "robust_acc_night")]
    pm = prev.data.metrics if prev is not None else {}
    table = "\n".join(f"| {label} | {f(now.get(k))} | {f(pm.get(k))} |" for label, k in rows)
    prev_line = (f"Previous night: {prev.data.tags.get('night')} (MLflow run `{prev.info.run_id}`)" if prev is not None
                 else "No previous night (first run).")
    return (f"{head}Model `{mv.name}` version {mv.version} (alias `{ALIAS}`, source run `{mv.run_id}`), "
            f"defense `{defense}` (evaluation.default_defense), night {night}.\n\n"
            f"| metric | tonight | previous night |\n|---|---|---|\n{table}\n\n{prev_line}\n\n"
            f"{_change_line(now, threshold, extra.get('reference'))}\n\n{_power_line(extra)}\n\n"
            f"{_new_data_lines(extra.get('new_data'), defense)}MLflow run: {run_link}\n")


def _power_line(extra: dict) -> str:
    mdd, n = extra.get("min_detectable_drop"), extra.get("reference_n")
    if mdd is None:
        return f"{n} reviews: no drop is detectable at this threshold." if n else ""
    return (f"Power: the reference suite has {n} reviews; the alarm detects (80% power) a drop of at least "
            f"{100 * mdd:.1f} points (min_detectable_drop); a smaller regression passes unseen.")


def _new_data_lines(new: dict | None, defense: str) -> str:
    if not new:
        return ""
    w, d = new["with_defense"], new["drift"]
    return (f"New reviews ({new['n']}, `{new['source']}`): accuracy with {defense} {w['acc']:.3f} against "
            f"{w['acc_reference']:.3f} on the test split: {100 * w['delta']:+.2f} points, 95% interval "
            f"[{100 * w['ci_low']:+.2f}, {100 * w['ci_high']:+.2f}] (Newcombe, unpaired). Drift: label shares "
            f"{d['label_shares']['new']} (training {d['label_shares']['train']}), mean words "
            f"{d['mean_words']['new']:.1f} (training {d['mean_words']['train']:.1f}), words unseen in training "
            f"{d['unseen_word_share']['new']:.3f} (test split {d['unseen_word_share']['test']:.3f}).\n\n")


def _change_line(now: dict, threshold: float, reference: dict | None) -> str:
    """The alarm's evidence: the paired change with its interval, and what the rule made of it."""
    if "robust_acc_change" not in now:
        return ("No paired baseline (no previous night with stored predictions, and the champion's pipeline run "
                "has none for this suite): nothing to compare, no alarm.")
    c, lo, hi = (100 * now[k] for k in ("robust_acc_change", "robust_acc_change_ci_low", "robust_acc_change_ci_high"))
    fired = hi < -100 * threshold
    return (f"Robust accuracy change, tonight minus {reference['against']} on the same reference reviews: {c:+.2f} "
            f"points, 95% paired interval [{lo:+.2f}, {hi:+.2f}], McNemar p={now['robust_acc_change_p_mcnemar']:.3g}. "
            f"The alarm fires only when the whole interval lies below -{100 * threshold:.2f} points: "
            + ("it does." if fired else "it does not."))


def _check_labels(model: dict, data: dict) -> None:
    """The champion must have been trained on the data's label set, in the same order."""
    trained_on = json.loads((Path(model["path"]) / "model" / "labels.json").read_text())
    scored_on = json.loads((Path(data["path"]) / "labels.json").read_text())
    if list(trained_on.values()) != [scored_on[str(i)] for i in range(len(scored_on))]:
        raise PipelineError(f"the champion's labels {list(trained_on.values())} differ from the data's "
                            f"{list(scored_on.values())}", "pass the config (data section) the champion was trained with")


def _model_length(cfg, model: dict):
    """A classifier brought with `evaluate --model` is scored at the length it was evaluated at (its own limit
    when that is below model.max_length)."""
    meta = json.loads((Path(model["path"]) / "model" / "meta.json").read_text())
    if meta.get("kind", "review_classifier") == "review_classifier" or meta["max_length"] == cfg.model.max_length:
        return cfg
    cfg = cfg.model_copy(deep=True)
    cfg.model.max_length = meta["max_length"]
    return cfg


def _score_suites(cfg, data: dict, model: dict, night_seed: int, reference_seed: int) -> tuple[dict, dict]:
    """({suite: result rows}, {suite: predictions}) for tonight's suite (with clean) and the reference suite."""
    results, preds = {}, {}
    for suite, seed, with_clean in (("night", night_seed, True), ("ref", reference_seed, False)):
        c = cfg.model_copy(deep=True)
        c.corruption.seed = seed
        corrupted, _ = run_task(corrupt_task, c, data)
        families = None if with_clean else list(c.corruption.families)
        if c.execution.mode == "deployments":
            shares = ([["clean"]] if with_clean else []) + [[fam] for fam in c.corruption.families]
            outs, _ = evaluate_on_gpu(c, data, model, corrupted, shares)
        else:
            outs = [run_task(evaluate_task, c, data, model, corrupted, families)[0]]
        results[suite] = steps.load_results([steps.StepOutput(**o) for o in outs])["rows"]
        preds[suite] = steps.read_predictions([steps.StepOutput(**o) for o in outs])
    return results, preds


def _against_previous(tracker: Tracker, prev, mv, now: dict, ref_preds, threshold: float, cfg,
                      defense: str) -> dict | None:
    """Adds the changes since the baseline (previous night, else the champion's pipeline run) to `now`; the
    paired check of the reference suite, if any."""
    if prev is not None:
        now["robust_acc_drop"] = prev.data.metrics["robust_acc_ref"] - now["robust_acc_ref"]
        if "robust_acc_night" in prev.data.metrics and now.get("robust_acc_night") is not None:
            now["robust_acc_night_drop"] = prev.data.metrics["robust_acc_night"] - now["robust_acc_night"]
    check = compare_nights(tracker, prev, ref_preds, threshold, cfg, defense, mv)
    if check is not None:
        now.update({"robust_acc_change": check["delta"], "robust_acc_change_ci_low": check["ci_low"],
                    "robust_acc_change_ci_high": check["ci_high"], "robust_acc_change_p_mcnemar": check["p_mcnemar"]})
    return check


def _log_night(tracker: Tracker, run_id: str, cfg, params: dict, now: dict, results: dict, preds: dict,
               extra: dict, wall_s: float) -> None:
    """Params, metrics, results and the reference predictions (tomorrow's paired comparison reads them)."""
    tracker.params(run_id, {**params,
                            **{f"corruption.{k}": v for k, v in cfg.corruption.model_dump(mode="json").items()
                               if k != "seed"},
                            **flatten(cfg.ttt.model_dump(mode="json"), "ttt.")})
    per_set = {f"{suite}/acc/{metric_name(r)}": r["acc"] for suite, rows in results.items() for r in rows}
    new = extra.get("new_data")
    flat_new = {} if not new else {f"new_data/{part}/{k}": float(new[part][k]) for part in
                                   ("with_defense", "without_defense") for k in ("acc", "acc_reference", "delta",
                                                                                 "ci_low", "ci_high")}
    if new:
        flat_new.update({"new_data/n": new["n"], "new_data/label_share_shift": new["drift"]["label_share_shift"],
                         "new_data/unseen_word_share": new["drift"]["unseen_word_share"]["new"] or 0.0})
    mdd = {"min_detectable_drop": extra["min_detectable_drop"]} if extra.get("min_detectable_drop") is not None else {}
    tracker.metrics(run_id, {**{k: v for k, v in now.items() if v is not None}, **per_set, **flat_new, **mdd,
                             "wall_s": wall_s})
    tracker.dict(run_id, results, "nightly_results.json")
    if extra.get("reference") is not None:
        tracker.dict(run_id, extra["reference"], "nightly_comparison.json")
    if new:
        tracker.dict(run_id, new, "nightly_new_data.json")
    with tempfile.TemporaryDirectory(prefix="ttt-nightly-") as tmp:
        preds["ref"].to_parquet(Path(tmp) / REF_PREDICTIONS, index=False)
        tracker.artifact(run_id, Path(tmp) / REF_PREDICTIONS)


def _nightly_config(config: PipelineConfig) -> PipelineConfig:
    """The night scores `none` and the recommended defense only (clean too: the new data's baseline)."""
    cfg = absolute_paths(config)
    defense = cfg.evaluation.defense
    cfg.evaluation.default_defense = None  # reassigned below, once ttt.methods holds it
    cfg.ttt.methods = list(dict.fromkeys(["none", defense]))
    cfg.evaluation.default_defense = None if defense == "none" else defense
    return cfg


def _no_champion(exc: NoChampion, tracker: Tracker, night: str, name: str, defense: str):
    """The artifact that says what to do, the event, and the NoChampion state (the summary as its data)."""
    create_markdown_artifact(_no_champion_report(exc, tracker.uri, night), key="nightly-reevaluation",
                             description=f"NO CHAMPION: nothing re-evaluated {night}")
    summary = {"night": night, "defense": defense, "verdict": "no_champion", "model_name": name,
               "reference": None, "min_detectable_drop": None, "message": exc.message, "hint": exc.hint}
    summary["event"] = emit_outcome("no_champion", name, {k: summary[k] for k in ("night", "defense", "message")})
    return Failed(name="NoChampion", message=f"{exc.message} (hint: {exc.hint})", data=summary)


def _figures(results: dict, defense: str) -> dict:
    h_night, h_ref = headline(results["night"], defense), headline(results["ref"], defense)
    return {"acc_clean": h_night.get("acc_clean"), "acc_clean_ttt": h_night.get("acc_clean_default"),
            "acc_corrupted_night": h_night.get("acc_corrupted"), "robust_acc_night": h_night.get("acc_default"),
            "acc_corrupted_ref": h_ref.get("acc_corrupted"), "robust_acc_ref": h_ref.get("acc_default")}


def _difference(d: dict | None) -> dict | None:
    keep = ("delta", "ci_low", "ci_high", "p_mcnemar", "helped", "hurt", "n", "against", "significant")
    return None if d is None else {k: d[k] for k in keep if k in d}


def _extra(check: dict | None, ref_preds, new: dict | None, threshold: float, confidence: float) -> dict:
    """The JSON contract's figures: reference and new-data changes, the alarm's power."""
    n = int(ref_preds["index"].nunique())
    extra = {"reference": _difference(check), "reference_n": n,
             "min_detectable_drop": min_detectable_drop(n, threshold, confidence)}
    if new is not None:
        w = new["with_defense"]
        extra["new_data"] = {**{k: w[k] for k in ("delta", "ci_low", "ci_high", "acc", "acc_reference")},
                             "n": new["n"], "source": new["source"], "without_defense": new["without_defense"],
                             "with_defense": w, "drift": new["drift"]}
    return extra


def _finish(summary: dict, regression: bool, check: dict | None, threshold: float):
    """The event with the figures, then the final state: Completed with the summary, or "Regression"."""
    payload = {k: summary.get(k) for k in ("night", "defense", "model_name", "model_version", "reference",
                                           "min_detectable_drop", "mlflow_run_id", "robust_acc_ref")}
    if summary.get("new_data"):
        payload["new_data"] = {k: summary["new_data"][k] for k in ("delta", "ci_low", "ci_high", "n")}
    summary["event"] = emit_outcome(summary["verdict"], summary["model_name"], payload)
    if not regression:
        return summary
    return Failed(name="Regression", data=summary, message=(
        f"robust accuracy of {summary['model_name']} v{summary['model_version']} under {summary['defense']} on the "
        f"reference suite fell to {summary['robust_acc_ref']:.3f} ({summary['night']}) against {check['against']}: "
        f"change {100 * check['delta']:+.2f} points, 95% paired interval [{100 * check['ci_low']:+.2f}, "
        f"{100 * check['ci_high']:+.2f}] lies below -{100 * threshold:.2f}"))


def _tag_version(tracker: Tracker, mv, run_id: str, now: dict) -> None:
    try:
        tracker.client.set_model_version_tag(mv.name, mv.version, "nightly.last_run_id", run_id)
        tracker.client.set_model_version_tag(mv.name, mv.version, "nightly.last_robust_acc_ref",
                                             f"{now['robust_acc_ref']:.4f}")
    except Exception as exc:  # tagging the version is a convenience; the run carries the link anyway
        get_run_logger().warning("could not tag model version %s/%s: %s", mv.name, mv.version, exc)


def _record(tracker: Tracker, cfg, mv, night: str, seeds: tuple[int, int], threshold: float, prev, now: dict,
            results: dict, preds: dict, extra: dict, regression: bool, wall_s: float) -> str:
    """The MLflow run of the night, the version's tags and the markdown artifact; returns the run id."""
    from prefect.runtime import flow_run

    defense = cfg.evaluation.defense
    run_id = tracker.start(f"nightly-{night}", tags={
        "ttt_run_kind": RUN_KIND, "night": night, "registered_model": mv.name, "model_version": str(mv.version),
        "model_alias": ALIAS, "model_source_run_id": mv.run_id or "", "model_source": mv.source or "",
        "prefect.flow_run_id": str(flow_run.get_id() or ""), "previous_run_id": prev.info.run_id if prev else "",
        "defense": defense, "regression": str(regression).lower()})
    _log_night(tracker, run_id, cfg, {"night_seed": seeds[0], "reference_seed": seeds[1], "threshold": threshold,
                                      "defense": defense}, now, results, preds, extra, wall_s)
    _tag_version(tracker, mv, run_id, now)
    link = f"experiment {tracker.experiment_id}, run {run_id}"
    if tracker.uri.startswith("http"):
        link = f"{tracker.uri}/#/experiments/{tracker.experiment_id}/runs/{run_id}"
    create_markdown_artifact(_report(night, mv, now, prev, threshold, regression, link, defense, extra),
                             key="nightly-reevaluation",
                             description=("REGRESSION: " if regression else "") + f"champion re-evaluation {night}")
    tracker.end(run_id, "FAILED" if regression else "FINISHED")
    return run_id


# No retries, whatever PREFECT_FLOW_DEFAULT_RETRIES says: no champion, a regression or bad data would fail the
# same way again; the next night runs anyway.
@flow(name="nightly-reevaluation", retries=0)
@name_presets
def nightly_reevaluation(config: PipelineConfig | None = None, threshold: float = 0.02,
                         reference_seed: int = 42, night: str | None = None, preset: str | None = None,
                         overrides: dict[str, Any] | None = None):
    """Re-evaluate the `champion` under its recommended defense on tonight's and the reference corruption suites
    (and on `nightly.data_path`); ends Completed, "Regression" or "NoChampion", each with its event.

    Args:
        config: The whole configuration (what `ttt-pipeline reevaluate` passes); when given, preset is not read.
        threshold: The alarm's threshold (accuracy fraction): a regression when the whole 95% paired interval of
            the change lies below -threshold.
        reference_seed: Seed of the fixed reference corruption suite.
        night: The night's date YYYY-MM-DD (re-run a given night); empty: the scheduled start's date.
        preset: The champion's task: a preset by name (PRESET_NAMES) or a YAML file on the worker; empty: demo.
        overrides: Fields set on top, as dotted keys or sections, e.g. {"nightly.data_path": "new/"}.
    """
    from prefect.runtime import flow_run

    t0 = time.perf_counter()
    cfg = _nightly_config(flow_config(config, preset, overrides))
    defense = cfg.evaluation.defense
    night = night or night_of(flow_run.get_scheduled_start_time() if flow_run.get_id() else None)
    night_seed = seed_for(night)
    tracker = Tracker.from_config(cfg.tracking)
    tracker.check()
    data, _ = run_task(download_task, cfg)
    name = cfg.model_name(data["meta"]["label_names"])
    try:
        mv = load_champion(tracker.client, name)
    except NoChampion as exc:
        return _no_champion(exc, tracker, night, name, defense)
    get_run_logger().info("champion: %s version %s (run %s), defense %s; night %s, seed %d; reference seed %d",
                          mv.name, mv.version, mv.run_id, defense, night, night_seed, reference_seed)
    model = fetch_champion(tracker, open_store(cfg.store), mv)
    _check_labels(model, data)
    cfg = _model_length(cfg, model)
    results, preds = _score_suites(cfg, data, model, night_seed, reference_seed)
    now = _figures(results, defense)
    prev = previous_night(tracker, mv.name, night)
    check = _against_previous(tracker, prev, mv, now, preds["ref"], threshold, cfg, defense)
    new = run_task(new_data_task, cfg, data, model, defense)[0] if cfg.nightly.data_path else None
    extra = _extra(check, preds["ref"], new, threshold, cfg.evaluation.confidence)
    regression = bool(check and check["regression"])
    run_id = _record(tracker, cfg, mv, night, (night_seed, reference_seed), threshold, prev, now, results, preds,
                     extra, regression, time.perf_counter() - t0)
    summary = {"night": night, "defense": defense, "verdict": "regression" if regression else "ok",
               "model_name": mv.name, "model_version": str(mv.version), "mlflow_run_id": run_id,
               "threshold": threshold, "night_seed": night_seed, "reference_seed": reference_seed,
               "regression": regression, "previous_run_id": prev.info.run_id if prev else None,
               **{k: v for k, v in extra.items() if k != "reference_n"}, "reference_n": extra["reference_n"], **now}
    get_run_logger().info("%s: robust accuracy (reference) %.3f, tonight's suite %.3f; %s", defense,
                          now["robust_acc_ref"], now["robust_acc_night"], _change_line(now, threshold, check))
    return _finish(summary, regression, check, threshold)
