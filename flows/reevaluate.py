"""`nightly-reevaluation`: is the registered champion still robust?

Every night: load the model version at alias `champion` of `registry.model_name` (MLflow registry), draw the
corruption suite with that night's seed (from the date) and with the fixed reference seed, score both
without and with masked TTT, log one MLflow run tagged with the model version, and compare it with the
previous night's run. Robust accuracy is the corrupted-set accuracy with TTT on the *reference* suite (the
same texts every night, so a drop is the model's or the code's, not the seed's); the night's fresh suite is
logged beside it (a gap between the two means the reference suite stopped being representative).

The alarm is paired: tonight's and the previous night's per-review predictions on the reference suite (the
same reviews) give the change in robust accuracy with a 95% bootstrap interval (masked TTT pooled over its mask
seeds). Only a change whose whole interval lies below -`threshold` is a regression: it fails the flow run, flags
a Prefect markdown artifact (with the interval) and ends the MLflow run as FAILED with tag `regression=true`. A
point drop the interval cannot tell from noise (a different mask seed, say) never fires.

Before the first pipeline run has registered a champion, the flow fails once (no retries) with that message and a
markdown artifact that says what to do.
"""

from __future__ import annotations

import datetime as dt
import json
import tempfile
import time
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows.stages import _run, evaluate_on_gpu, portable
from tasks import corrupt_task, download_task, evaluate_task
from ttt_pipeline import steps
from ttt_pipeline.config import PipelineConfig, default_config
from ttt_pipeline.errors import PipelineError
from ttt_pipeline.evaluation.scoring import headline, metric_name
from ttt_pipeline.io.remote_store import open_store
from ttt_pipeline.io.tracking import Tracker

RUN_KIND = "nightly-reevaluation"
REF_PREDICTIONS = "predictions_ref.parquet"
ROBUST_METHOD = "masked_ttt"
ALIAS = "champion"


class RobustnessRegression(Exception):
    """Robust accuracy fell by more than the threshold since the previous night."""


class NoChampion(PipelineError):
    """No model version holds the `champion` alias yet: there is nothing to re-evaluate."""


def night_of(scheduled: dt.datetime | None = None) -> str:
    """The night's date (YYYY-MM-DD): the scheduled start's own date, else today's."""
    when = scheduled or dt.datetime.now().astimezone()
    return when.date().isoformat()


def seed_for(night: str) -> int:
    """A different, reproducible corruption seed each night: 2025-01-31 -> 20250131."""
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
    for meta in sorted(Path(folder).rglob("meta.json"), key=lambda p: len(p.parts)):
        if (meta.parent / "head.safetensors").is_file():
            return meta.parent
    raise PipelineError(f"no saved classifier (meta.json + head.safetensors) under {folder}",
                        "the champion's source must be the `model` artifact logged by the fine-tune stage")


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


def compare_nights(tracker: Tracker, prev, tonight, threshold: float, cfg) -> dict | None:
    """Tonight minus the previous night, paired on the reference suite's reviews (ttt_pipeline.evaluation.robustness);
    None when the previous night stored no predictions or scored other reviews."""
    import pandas as pd

    from ttt_pipeline.evaluation.robustness import regression_between

    with tempfile.TemporaryDirectory(prefix="ttt-prev-") as tmp:
        try:
            previous = pd.read_parquet(tracker.client.download_artifacts(prev.info.run_id, REF_PREDICTIONS, tmp))
        except Exception:  # a night logged before predictions were kept: no paired comparison
            return None
    ev = cfg.evaluation
    return regression_between(previous, tonight, ROBUST_METHOD, threshold, resamples=ev.resamples,
                              confidence=ev.confidence, seed=ev.seed)


def _report(night: str, mv, now: dict, prev, threshold: float, regression: bool, run_link: str) -> str:
    def f(v):
        return "-" if v is None else f"{v:.3f}"

    head = (f"# ❌ REGRESSION — robust accuracy fell significantly by more than {100 * threshold:.1f} points\n\n"
            if regression else
            "# ✅ Nightly re-evaluation: no regression\n\n")
    rows = [("clean accuracy", "acc_clean"), ("clean accuracy with TTT", "acc_clean_ttt"),
            ("reference suite, corrupted", "acc_corrupted_ref"), ("reference suite, with TTT (robust)", "robust_acc_ref"),
            ("tonight's suite, corrupted", "acc_corrupted_night"), ("tonight's suite, with TTT", "robust_acc_night")]
    pm = prev.data.metrics if prev is not None else {}
    table = "\n".join(f"| {label} | {f(now.get(k))} | {f(pm.get(k))} |" for label, k in rows)
    prev_line = (f"Previous night: {prev.data.tags.get('night')} (MLflow run `{prev.info.run_id}`)" if prev is not None
                 else "No previous night to compare with (first run).")
    return (f"{head}Model `{mv.name}` version {mv.version} (alias `{ALIAS}`, source run `{mv.run_id}`), "
            f"night {night}.\n\n| metric | tonight | previous night |\n|---|---|---|\n{table}\n\n{prev_line}\n\n"
            f"{_change_line(now, threshold, prev)}\n\n"
            f"MLflow run: {run_link}\n")


# No retries, whatever PREFECT_FLOW_DEFAULT_RETRIES says: no champion, a regression or bad data would fail the
# same way again; the next night runs anyway.
def _change_line(now: dict, threshold: float, prev) -> str:
    """The alarm's evidence: the paired change with its interval, and what the rule made of it."""
    if prev is None:
        return "No previous night: nothing to compare."
    if "robust_acc_change" not in now:
        return (f"Drop of robust accuracy {now.get('robust_acc_drop', 0):+.3f} (point values only: the previous night "
                "stored no per-review predictions, so no paired interval and no alarm).")
    c, lo, hi = (100 * now[k] for k in ("robust_acc_change", "robust_acc_change_ci_low", "robust_acc_change_ci_high"))
    fired = hi < -100 * threshold
    return (f"Robust accuracy change, tonight minus previous night on the same reference reviews: {c:+.2f} points, "
            f"95% paired interval [{lo:+.2f}, {hi:+.2f}], McNemar p={now['robust_acc_change_p_mcnemar']:.3g}. "
            f"The alarm fires only when the whole interval lies below -{100 * threshold:.2f} points: "
            + ("it does." if fired else "it does not."))


def _check_labels(model: dict, data: dict) -> None:
    """The champion must have been trained on the data's label set, in the same order."""
    trained_on = json.loads((Path(model["path"]) / "model" / "labels.json").read_text())
    scored_on = json.loads((Path(data["path"]) / "labels.json").read_text())
    if list(trained_on.values()) != [scored_on[str(i)] for i in range(len(scored_on))]:
        raise PipelineError(f"the champion's labels {list(trained_on.values())} differ from the data's "
                            f"{list(scored_on.values())}", "pass the config (data section) the champion was trained with")


def _score_suites(cfg, data: dict, model: dict, night_seed: int, reference_seed: int) -> tuple[dict, dict]:
    """({suite: result rows}, {suite: predictions}) for tonight's suite (with clean) and the reference suite."""
    results, preds = {}, {}
    for suite, seed, with_clean in (("night", night_seed, True), ("ref", reference_seed, False)):
        c = cfg.model_copy(deep=True)
        c.corruption.seed = seed
        corrupted, _ = _run(corrupt_task, c, data)
        families = None if with_clean else list(c.corruption.families)
        if c.execution.mode == "deployments":
            shares = ([["clean"]] if with_clean else []) + [[fam] for fam in c.corruption.families]
            outs, _ = evaluate_on_gpu(c, data, model, corrupted, shares)
        else:
            outs = [_run(evaluate_task, c, data, model, corrupted, families)[0]]
        results[suite] = steps.load_results([steps.StepOutput(**o) for o in outs])["rows"]
        preds[suite] = steps.read_predictions([steps.StepOutput(**o) for o in outs])
    return results, preds


def _against_previous(tracker: Tracker, prev, now: dict, ref_preds, threshold: float, cfg) -> dict | None:
    """Adds the changes since the previous night to `now`; the paired check of the reference suite, if any."""
    if prev is None:
        return None
    now["robust_acc_drop"] = prev.data.metrics["robust_acc_ref"] - now["robust_acc_ref"]
    if "robust_acc_night" in prev.data.metrics and now["robust_acc_night"] is not None:
        now["robust_acc_night_drop"] = prev.data.metrics["robust_acc_night"] - now["robust_acc_night"]
    check = compare_nights(tracker, prev, ref_preds, threshold, cfg)
    if check is not None:
        now.update({"robust_acc_change": check["delta"], "robust_acc_change_ci_low": check["ci_low"],
                    "robust_acc_change_ci_high": check["ci_high"], "robust_acc_change_p_mcnemar": check["p_mcnemar"]})
    return check


def _log_night(tracker: Tracker, run_id: str, cfg, params: dict, now: dict, results: dict, preds: dict,
               check: dict | None, wall_s: float) -> None:
    """Params, metrics, results and the reference predictions (tomorrow's paired comparison reads them)."""
    tracker.params(run_id, {**params,
                            **{f"corruption.{k}": v for k, v in cfg.corruption.model_dump(mode="json").items()
                               if k != "seed"},
                            **{f"ttt.{k}": v for k, v in cfg.ttt.model_dump(mode="json").items()}})
    per_set = {f"{suite}/acc/{metric_name(r)}": r["acc"] for suite, rows in results.items() for r in rows}
    tracker.metrics(run_id, {**now, **per_set, "wall_s": wall_s})
    tracker.dict(run_id, results, "nightly_results.json")
    if check is not None:
        tracker.dict(run_id, check, "nightly_comparison.json")
    with tempfile.TemporaryDirectory(prefix="ttt-nightly-") as tmp:
        preds["ref"].to_parquet(Path(tmp) / REF_PREDICTIONS, index=False)
        tracker.artifact(run_id, Path(tmp) / REF_PREDICTIONS)


@flow(name="nightly-reevaluation", retries=0)
def nightly_reevaluation(config: PipelineConfig = default_config(), threshold: float = 0.02,
                         reference_seed: int = 42, night: str | None = None) -> dict:
    """Re-evaluate the `champion` on tonight's and the reference corruption suites; fail on a robustness drop."""
    from prefect.runtime import flow_run

    t0 = time.perf_counter()
    logger = get_run_logger()
    cfg = portable(config)
    if "none" not in cfg.ttt.methods or "masked_ttt" not in cfg.ttt.methods:
        cfg.ttt.methods = list(dict.fromkeys(["none", "masked_ttt", *cfg.ttt.methods]))
    night = night or night_of(flow_run.get_scheduled_start_time() if flow_run.get_id() else None)
    night_seed = seed_for(night)
    tracker = Tracker.from_config(cfg.tracking)
    tracker.check()
    try:
        mv = load_champion(tracker.client, cfg.registry.model_name)
    except NoChampion as exc:
        create_markdown_artifact(_no_champion_report(exc, tracker.uri, night), key="nightly-reevaluation",
                                 description=f"NO CHAMPION: nothing re-evaluated {night}")
        raise
    logger.info("champion: %s version %s (run %s); night %s, seed %d; reference seed %d",
                mv.name, mv.version, mv.run_id, night, night_seed, reference_seed)
    store = open_store(cfg.store)
    model = fetch_champion(tracker, store, mv)
    data, _ = _run(download_task, cfg)
    _check_labels(model, data)
    results, preds = _score_suites(cfg, data, model, night_seed, reference_seed)
    h_night, h_ref = headline(results["night"]), headline(results["ref"])
    now = {"acc_clean": h_night.get("acc_clean"), "acc_clean_ttt": h_night.get("acc_clean_ttt"),
           "acc_corrupted_night": h_night.get("acc_corrupted"), "robust_acc_night": h_night.get("acc_ttt"),
           "acc_corrupted_ref": h_ref.get("acc_corrupted"), "robust_acc_ref": h_ref.get("acc_ttt")}
    prev = previous_night(tracker, mv.name, night)
    check = _against_previous(tracker, prev, now, preds["ref"], threshold, cfg)
    regression = bool(check and check["regression"])

    run_id = tracker.start(f"nightly-{night}", tags={
        "ttt_run_kind": RUN_KIND, "night": night, "registered_model": mv.name, "model_version": str(mv.version),
        "model_alias": ALIAS, "model_source_run_id": mv.run_id or "", "model_source": mv.source or "",
        "prefect.flow_run_id": str(flow_run.get_id() or ""), "previous_run_id": prev.info.run_id if prev else "",
        "regression": str(regression).lower()})
    _log_night(tracker, run_id, cfg, {"night_seed": night_seed, "reference_seed": reference_seed,
                                      "threshold": threshold}, now, results, preds, check, time.perf_counter() - t0)
    try:
        tracker.client.set_model_version_tag(mv.name, mv.version, "nightly.last_run_id", run_id)
        tracker.client.set_model_version_tag(mv.name, mv.version, "nightly.last_robust_acc_ref",
                                             f"{now['robust_acc_ref']:.4f}")
    except Exception as exc:  # tagging the version is a convenience; the run carries the link anyway
        logger.warning("could not tag model version %s/%s: %s", mv.name, mv.version, exc)
    exp_link = f"experiment {tracker.experiment_id}, run {run_id}"
    if tracker.uri.startswith("http"):
        exp_link = f"{tracker.uri}/#/experiments/{tracker.experiment_id}/runs/{run_id}"
    create_markdown_artifact(_report(night, mv, now, prev, threshold, regression, exp_link),
                             key="nightly-reevaluation",
                             description=("REGRESSION: " if regression else "") + f"champion re-evaluation {night}")
    tracker.end(run_id, "FAILED" if regression else "FINISHED")
    summary = {"mlflow_run_id": run_id, "night": night, "night_seed": night_seed, "reference_seed": reference_seed,
               "model_name": mv.name, "model_version": str(mv.version), "regression": regression,
               "previous_run_id": prev.info.run_id if prev else None, **now}
    if regression:
        raise RobustnessRegression(
            f"robust accuracy of {mv.name} v{mv.version} on the reference suite fell from "
            f"{prev.data.metrics['robust_acc_ref']:.3f} ({prev.data.tags.get('night')}) to "
            f"{now['robust_acc_ref']:.3f} ({night}): change {100 * check['delta']:+.2f} points, 95% paired interval "
            f"[{100 * check['ci_low']:+.2f}, {100 * check['ci_high']:+.2f}] lies below -{100 * threshold:.2f}")
    logger.info("robust accuracy (reference) %.3f, tonight's suite %.3f; %s", now["robust_acc_ref"],
                now["robust_acc_night"], "no previous night" if prev is None else
                f"drop {now['robust_acc_drop']:+.3f} vs {prev.data.tags.get('night')}")
    return summary
