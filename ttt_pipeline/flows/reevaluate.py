"""`nightly-reevaluation`: does the registered champion still hold up under its recommended defense?

Every night: load the model version at alias `champion` of the task's registered model (`PipelineConfig.model_name`:
one per dataset and label set), draw the corruption suite with that night's seed (from the date) and with the fixed
reference seed, and score both without and with the recommended defense (`evaluation.default_defense`, the one
source: `none` when it is null). With `nightly.data_path`, the champion is also scored on labelled reviews that
arrived since training (the `new-reviews` step). The decisions are `ttt_pipeline/nightly.py`'s, the MLflow reads and
writes `io/nights.py`'s, the markdown `reports/nightly.py`'s; this flow wires them.

The alarm is paired: tonight's per-review predictions on the reference suite against the previous night's (or,
on the first night, the champion's own pipeline run's: the same reviews) give the change with a 95% bootstrap
interval. Only a change whose whole interval lies below -`threshold` is a regression; `min_detectable_drop` says
how large a drop the suite's size lets it see.

Outcomes, each a Prefect event with the figures in its payload (`ttt_pipeline/events.py`) and a final state of its
own: `ttt.nightly.ok` (Completed), `ttt.nightly.regression` (state "Regression", failed type: the MLflow run ends
FAILED with tag regression=true, the markdown artifact is flagged) and `ttt.nightly.no-champion` (state
"NoChampion", failed type, no retries, an artifact that says what to do). A crash stays plain Failed. The same
flow is the command `ttt-pipeline reevaluate`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.states import Failed

from ttt_pipeline import nightly, steps
from ttt_pipeline.config import PipelineConfig, flow_config
from ttt_pipeline.errors import NoChampion
from ttt_pipeline.events import emit_outcome
from ttt_pipeline.flows.forms import name_presets
from ttt_pipeline.flows.gpu_pool import evaluate_on_gpu, run_task
from ttt_pipeline.io import brought_models, nights
from ttt_pipeline.io.remote_store import open_store
from ttt_pipeline.io.tracking import Tracker
from ttt_pipeline.reports.nightly import change_line, night_report, no_champion_report
from ttt_pipeline.tasks import corrupt_task, download_task, evaluate_task, new_reviews_task


def _score_suites(cfg, data: dict, model: dict, night_seed: int, reference_seed: int) -> tuple[dict, dict]:
    """({suite: result rows}, {suite: predictions}) for tonight's suite (with clean) and the reference suite."""
    results, preds = {}, {}
    for suite, seed, with_clean in (("night", night_seed, True), ("ref", reference_seed, False)):
        c = nightly.suite_config(cfg, seed)
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


def _no_champion(exc: NoChampion, tracker: Tracker, night: str, name: str, defense: str):
    """The artifact that says what to do, the event, and the NoChampion state (the summary as its data)."""
    create_markdown_artifact(no_champion_report(exc.message, exc.hint, tracker.uri, night), key="nightly-reevaluation",
                             description=f"NO CHAMPION: nothing re-evaluated {night}")
    summary = nightly.no_champion_summary(night, defense, name, exc)
    summary["event"] = emit_outcome("no_champion", name, {k: summary[k] for k in ("night", "defense", "message")})
    return Failed(name="NoChampion", message=f"{exc.message} (hint: {exc.hint})", data=summary)


def _record(tracker: Tracker, cfg, mv, night: str, seeds: tuple[int, int], threshold: float, prev, now: dict,
            results: dict, preds: dict, extra: dict, regression: bool, wall_s: float) -> str:
    """The MLflow run of the night, the version's tags and the markdown artifact; returns the run id."""
    from prefect.runtime import flow_run

    defense = cfg.evaluation.defense
    run_id = nights.start_night(tracker, night, mv, prev, defense, regression, str(flow_run.get_id() or ""))
    nights.log_night(tracker, run_id, cfg, {"night_seed": seeds[0], "reference_seed": seeds[1],
                                            "threshold": threshold, "defense": defense},
                     now, results, preds["ref"], extra, wall_s)
    nights.tag_version(tracker, mv, run_id, now)
    create_markdown_artifact(night_report(night, mv, now, prev, threshold, regression, nights.run_link(tracker, run_id),
                                          defense, extra), key="nightly-reevaluation",
                             description=("REGRESSION: " if regression else "") + f"champion re-evaluation {night}")
    tracker.end(run_id, "FAILED" if regression else "FINISHED")
    return run_id


def _finish(summary: dict, regression: bool, check: dict | None, threshold: float):
    """The event with the figures, then the final state: Completed with the summary, or "Regression"."""
    summary["event"] = emit_outcome(summary["verdict"], summary["model_name"], nightly.event_payload(summary))
    if not regression:
        return summary
    return Failed(name="Regression", data=summary, message=nightly.regression_message(summary, check, threshold))


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
    cfg = nightly.nightly_config(flow_config(config, preset, overrides))
    defense = cfg.evaluation.defense
    night = night or nightly.night_of(flow_run.get_scheduled_start_time() if flow_run.get_id() else None)
    night_seed = nightly.seed_for(night)
    tracker = Tracker.from_config(cfg.tracking)
    tracker.check()
    data, _ = run_task(download_task, cfg)
    name = brought_models.watched_name(tracker.client, cfg, data["meta"]["label_names"])
    try:
        mv = nights.judged_version(tracker.client, cfg, name, tracker.uri)
    except NoChampion as exc:
        return _no_champion(exc, tracker, night, name, defense)
    get_run_logger().info("champion: %s version %s (run %s), defense %s; night %s, seed %d; reference seed %d",
                          mv.name, mv.version, mv.run_id, defense, night, night_seed, reference_seed)
    model = nights.fetch_champion(tracker, open_store(cfg.store), mv)
    nightly.check_labels(Path(model["path"]) / "model", Path(data["path"]))
    cfg = nightly.scored_config(cfg, Path(model["path"]) / "model")
    results, preds = _score_suites(cfg, data, model, night_seed, reference_seed)
    now = nightly.figures(results, defense)
    prev = nights.previous_night(tracker, mv.name, night)
    check = nights.compare_nights(tracker, prev, preds["ref"], threshold, cfg, defense, mv)
    nightly.against_previous(now, prev.data.metrics if prev is not None else None, check)
    new = run_task(new_reviews_task, cfg, data, model, defense)[0]["meta"] if cfg.nightly.data_path else None
    extra = nightly.extra_figures(check, int(preds["ref"]["index"].nunique()), new, threshold,
                                  cfg.evaluation.confidence)
    regression = bool(check and check["regression"])
    run_id = _record(tracker, cfg, mv, night, (night_seed, reference_seed), threshold, prev, now, results, preds,
                     extra, regression, time.perf_counter() - t0)
    summary = nightly.summary(night, defense, mv, run_id, threshold, (night_seed, reference_seed),
                              prev.info.run_id if prev else None, extra, now, regression)
    get_run_logger().info("%s: robust accuracy (reference) %.3f, tonight's suite %.3f; %s", defense,
                          now["robust_acc_ref"], now["robust_acc_night"], change_line(now, threshold, check))
    return _finish(summary, regression, check, threshold)
