"""The `ttt-pipeline` flow: download -> tokenise -> finetune, corrupt -> evaluate, tracked in MLflow."""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from ttt_pipeline import steps
from ttt_pipeline.config import PipelineConfig, flow_config
from ttt_pipeline.errors import ConfigError
from ttt_pipeline.evaluation.stats import format_difference
from ttt_pipeline.flows.forms import name_presets
from ttt_pipeline.flows.gpu_pool import run_task
from ttt_pipeline.flows.stopping import reclaim
from ttt_pipeline.io.tracking import Tracker
from ttt_pipeline.reports.flips import run_description
from ttt_pipeline.reports.run import headline_markdown
from ttt_pipeline.storage import StepOutput
from ttt_pipeline.tasks import (
    attribute_task,
    calibrate_task,
    corrupt_task,
    download_task,
    evaluate_task,
    finetune_task,
    log_calibration_task,
    log_step_task,
    report_task,
    tokenise_task,
)
from ttt_pipeline.tasks.model_registry import register_task

STEP_WORK = {"download": "read, check and split the reviews", "tokenise": "tokenise the reviews",
              "corrupt": "write the corrupted test sets", "finetune": "train the classifier",
              "evaluate": "score clean and corrupted test reviews under every method",
              "attribute": "find the training reviews behind flipped predictions",
              "calibrate": "fit the label-free drop forecast on the corrupted sets",
              "calibration-corrupt": "write the forecast's own calibration sets (the run's are too few)",
              "calibration-evaluate": "score the calibration sets under none and the default defense",
              "report": "write the report of the reviews the noise flipped",
              "import-model": "load the classifier, match its labels to the data's, find an MLM head"}


def _run(task_fn, *args, **kwargs):
    """(result, served_from_cache): a Prefect cache hit or a verified store hit both count. The stage's start
    and end are logged with its name, cached or computed, and its time (the terminal and the Prefect UI)."""
    from ttt_pipeline.tasks.progress import duration

    logger = get_run_logger()
    name = task_fn.name
    logger.info("%s: started (%s)", name, STEP_WORK.get(name, name))
    t0 = time.perf_counter()
    result, cached = run_task(task_fn, *args, **kwargs)
    logger.info("%s: %s in %s", name, "cached (served from the store)" if cached else "computed",
                duration(time.perf_counter() - t0))
    return result, cached


@flow(name="ttt-pipeline")
@name_presets
def ttt_pipeline(config: PipelineConfig | None = None, preset: str | None = None,
                 overrides: dict[str, Any] | None = None) -> dict:
    """Fine-tune a review classifier, then score it on clean, corrupted and shifted text, without and with TTT.

    Args:
        config: The whole configuration (what `ttt-pipeline run` passes); when given, preset is not read.
        preset: A preset by name (PRESET_NAMES) or a YAML file on the worker; empty: demo. Read when the run
            starts, on the worker.
        overrides: Fields set on top of the preset or config, as dotted keys or sections, e.g.
            {"finetune.epochs": 2, "data.path": "data/my_reviews.csv"}.
    """
    reclaim()  # a caller's stop handler (ttt-pipeline run) instead of Prefect's: exits in seconds, says what is kept
    t0 = time.perf_counter()
    cfg = flow_config(config, preset, overrides)
    if cfg.data.label_column is None:
        raise ConfigError("data.label_column is null (unlabelled reviews): a classifier is trained on labels",
                          "score unlabelled reviews with a trained model: ttt-pipeline evaluate --model MODEL "
                          "--set data.label_column=null; to train, name the label column (data.label_column)")
    if cfg.attribution.enabled:  # its optional package is missing: say so now, not after training
        from ttt_pipeline.evaluation.attribution import require_traker

        require_traker()
    tracker, parent = open_run(cfg, "ttt-pipeline", cfg.model.name)
    cached: dict[str, bool] = {}
    try:
        data, cached["download"] = _run(download_task, cfg)
        log_step_task(cfg, "download", [data], parent, cached["download"])
        tokens, cached["tokenise"] = _run(tokenise_task, cfg, data)
        log_step_task(cfg, "tokenise", [tokens], parent, cached["tokenise"])
        corrupted, cached["corrupt"] = _run(corrupt_task, cfg, data)
        log_step_task(cfg, "corrupt", [corrupted], parent, cached["corrupt"])
        if cfg.execution.mode == "deployments":  # heavy steps on the gpu pool (ttt_pipeline/flows/gpu_pool.py)
            from ttt_pipeline.flows.gpu_pool import run_heavy_steps

            model, evaluations, cached["finetune"], cached["evaluate"] = run_heavy_steps(
                cfg, data, tokens, corrupted, parent)
        else:
            model, cached["finetune"] = _run(finetune_task, cfg, data, tokens)
            log_step_task(cfg, "finetune", [model, data], parent, cached["finetune"])
            evaluation, cached["evaluate"] = _run(evaluate_task, cfg, data, model, corrupted)
            evaluations = [evaluation]
        logged = log_step_task(cfg, "evaluate", evaluations, parent, cached["evaluate"])
        report = report_task(cfg, data, corrupted, evaluations, parent, logged)
        forecast = calibrate(cfg, data, model, corrupted, evaluations, parent)
        if cfg.attribution.enabled:  # optional: a disabled run has no attribute task, child run or cache count
            attributed, cached["attribute"] = _run(attribute_task, cfg, data, model, corrupted, evaluations)
            log_step_task(cfg, "attribute", [attributed], parent, cached["attribute"])
    except BaseException:
        tracker.end(parent, "FAILED")
        raise
    return finish(cfg, tracker, parent, logged, cached, model, data, t0, {**forecast, **report})


def calibrate(cfg: PipelineConfig, data: dict, model: dict, corrupted: dict, evaluations: list[dict],
              parent: str) -> dict:
    """The label-free drop forecast calibrated on the evaluated sets (on the calibration's own suite where they are
    too few: `steps.calibration_suite`) and logged on the parent run: the summary's `forecast_calibration` and
    `forecast_calibration_note`. Not one of the summary's `cached` tasks (the run's
    five, or six with attribute); its log line says whether the store served it, or why it was skipped."""
    suite = steps.calibration_suite(cfg, StepOutput(**corrupted))
    if suite is not None:  # too few sets of its own: the calibration's suite, scored for the calibrate step alone
        cfg = suite
        corrupted, evaluations = calibration_sets(cfg, data, model)
    reason = steps.calibration_skip_reason(cfg, StepOutput(**corrupted))
    if reason is not None:
        get_run_logger().info("calibrate: skipped: %s", reason)
        return {"forecast_calibration": None, "forecast_calibration_note": reason}
    calibration, _ = _run(calibrate_task, cfg, data, model, corrupted, evaluations)
    return log_calibration_task(cfg, calibration, parent)


def calibration_sets(suite: PipelineConfig, data: dict, model: dict) -> tuple[dict, list[dict]]:
    """The calibration suite's corrupted sets and their evaluation (`steps.calibration_suite`), by the ordinary
    cached tasks under their own names (on the gpu pool in deployments mode); logged on no MLflow run and in no
    summary: the run's reported figures stay its own sets'."""
    corrupted, _ = _run(corrupt_task.with_options(name="calibration-corrupt"), suite, data)
    if suite.execution.mode == "deployments":
        from ttt_pipeline.flows.gpu_pool import evaluate_on_gpu, evaluation_shares

        evaluations, _ = evaluate_on_gpu(suite, data, model, corrupted, evaluation_shares(suite))
        return corrupted, evaluations
    evaluation, _ = _run(evaluate_task.with_options(name="calibration-evaluate"), suite, data, model, corrupted)
    return corrupted, [evaluation]


def open_run(cfg: PipelineConfig, flow_name: str, model: str) -> tuple[Tracker, str]:
    """The tracking store checked, the run's machine choices decided and logged (once: every step reads the same
    `steps.runtime`), and the flow's parent MLflow run started with its tags and every parameter."""
    tracker = Tracker.from_config(cfg.tracking)
    tracker.check()
    machine = steps.runtime(cfg)
    get_run_logger().info("machine: %s", machine.describe())
    parent = tracker.start(cfg.tracking.run_name, tags={
        "prefect.flow_run_id": str(flow_run.get_id() or ""), "prefect.flow_name": flow_name, "model": model,
        "data": cfg.data.path, "device": machine.device.type, "precision.finetune": machine.train.name,
        "precision.scoring": machine.score.name, "attention": machine.attention.name or "checkpoint"})
    tracker.params(parent, cfg.flat())
    return tracker, parent


def finish(cfg: PipelineConfig, tracker: Tracker, parent: str, logged: dict, cached: dict[str, bool], model: dict,
           data: dict, t0: float, extra: dict | None = None) -> dict:
    """The run's summary (headline, statistics, cache hits), its MLflow metrics, the registry decision, the Prefect
    artifact and the closing log line: what every flow that evaluates a model ends with."""
    logger = get_run_logger()
    head = logged["headline"]
    summary = {
        "mlflow_run_id": parent,
        "mlflow_tracking_uri": tracker.uri,
        "experiment_id": tracker.experiment_id,
        **head,
        **logged["stats"],
        "gains": logged["gains"],
        "cached_tasks": sum(cached.values()),
        "cached": cached,
        "model_path": model["path"],
        "wall_s": round(time.perf_counter() - t0, 2),
        **(extra or {}),
    }
    tracker.metrics(parent, {**head, **logged["flat"], "cached_tasks": summary["cached_tasks"],
                             "wall_s": summary["wall_s"]})
    tracker.tags(parent, {f"cache_hit.{k}": str(v).lower() for k, v in cached.items()})
    tracker.tags(parent, {"mlflow.note.content": run_description(summary)})  # the run page's Description
    summary["registry"] = summary["champion"] = None
    summary["default_defense"] = cfg.evaluation.defense
    if cfg.registry.enabled:  # register the model; alias `champion` when it wins on cfg.registry.metric
        try:
            summary["registry"] = register_task(cfg, parent, head, data["meta"]["label_names"])
        except BaseException:
            tracker.end(parent, "FAILED")
            raise
    tracker.end(parent)
    if summary["registry"]:
        reg = summary["registry"]
        summary["champion"] = {"model_name": reg["model_name"], "metric": reg["metric"],
                               "value": reg["candidate_value"], "alias_moved": reg["decision"] == "promoted"}
    create_markdown_artifact(headline_markdown(summary, tracker), key="ttt-pipeline-summary",
                             description=f"Clean / corrupted / {cfg.evaluation.defense} accuracy of this run")
    logger.info("clean %.3f | corrupted %.3f | %s (default defense) %.3f, gain %s | cached tasks %d/%d",
                head.get("acc_clean", float("nan")), head.get("acc_corrupted", float("nan")),
                cfg.evaluation.defense, head.get("acc_default", float("nan")),
                format_difference(summary["defense_gain"]) if "defense_gain" in summary else "-",
                summary["cached_tasks"], len(cached))
    return summary
