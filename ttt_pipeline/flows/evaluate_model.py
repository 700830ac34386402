"""The `evaluate-model` flow: a classifier fine-tuned elsewhere, scored like the pipeline's own.

download -> import-model (in the place of tokenise and finetune) and corrupt -> evaluate -> calibrate (the
label-free drop forecast, for the user's classifier too), then the same summary, MLflow run and registry decision
as `ttt-pipeline run` (`pipeline.finish`). The model is `model.classifier`.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger

from ttt_pipeline import steps
from ttt_pipeline.config import PipelineConfig, flow_config
from ttt_pipeline.errors import ConfigError
from ttt_pipeline.flows.forms import name_presets
from ttt_pipeline.flows.pipeline import _run, calibrate, finish, open_run
from ttt_pipeline.flows.stopping import reclaim
from ttt_pipeline.io import brought_models
from ttt_pipeline.storage import StepOutput
from ttt_pipeline.tasks import corrupt_task, download_task, evaluate_task, import_model_task, log_step_task, report_task


@flow(name="evaluate-model")
@name_presets
def evaluate_model(config: PipelineConfig | None = None, preset: str | None = None,
                   overrides: dict[str, Any] | None = None) -> dict:
    """Score an existing classifier (model.classifier: a Hugging Face folder, an MLflow model URI or a hub id) on
    clean, corrupted and shifted text under every defense it can run; no training.

    Args:
        config: The whole configuration (what `ttt-pipeline evaluate` passes); when given, preset is not read.
        preset: A preset by name (PRESET_NAMES) or a YAML file on the worker: the data, corruptions and
            defenses; empty: demo.
        overrides: Fields set on top, as dotted keys or sections; model.classifier names the model, e.g.
            {"model.classifier": "models:/my-classifier@prod"}.
    """
    reclaim()
    t0 = time.perf_counter()
    cfg = flow_config(config, preset, overrides)
    if not cfg.model.classifier:
        raise ConfigError("model.classifier is not set: there is no model to evaluate",
                          "ttt-pipeline evaluate --model FOLDER_OR_MODELS_URI, or set model.classifier (the "
                          "deployment's form: overrides {\"model.classifier\": \"models:/NAME@ALIAS\"})")
    tracker, parent = open_run(cfg, "evaluate-model", cfg.model.classifier)
    cached: dict[str, bool] = {}
    try:
        data, cached["download"] = _run(download_task, cfg)
        log_step_task(cfg, "download", [data], parent, cached["download"])
        model, cached["import-model"] = _run(import_model_task, cfg, data)
        log_step_task(cfg, "import-model", [model, data], parent, cached["import-model"])
        scored, notes = steps.evaluated_config(cfg, StepOutput(**model))
        for note in notes:
            get_run_logger().info("evaluate: %s", note)
        corrupted, cached["corrupt"] = _run(corrupt_task, scored, data)
        log_step_task(scored, "corrupt", [corrupted], parent, cached["corrupt"])
        evaluation, cached["evaluate"] = _run(evaluate_task, scored, data, model, corrupted)
        if data["meta"].get("labelled") is False:  # data.label_column null: prediction changes, no accuracy
            return label_free(scored, tracker, parent, model, evaluation, cached, notes, t0)
        logged = log_step_task(scored, "evaluate", [evaluation], parent, cached["evaluate"])
        report = report_task(scored, data, corrupted, [evaluation], parent, logged)
        forecast = calibrate(scored, data, model, corrupted, [evaluation], parent)
    except BaseException:
        tracker.end(parent, "FAILED")
        raise
    if notes:
        tracker.tags(parent, {"evaluate.notes": "; ".join(notes)})
    # one name per model: weights registered before (by another spelling) go to that name (io/brought_models.py)
    scored = brought_models.registered_name(tracker.client, scored, data["meta"]["label_names"], model["digest"])
    summary = finish(scored, tracker, parent, logged, cached, model, data, t0,
                     {"model": cfg.model.classifier, "notes": notes, "model_labels": model["meta"]["model_labels"],
                      **forecast, **report})
    brought_models.tag_version(tracker.client, summary["registry"], model["digest"], cfg.model.classifier,
                               brought_models.imported_files(model))
    return summary


# The forecast of each set's accuracy drop from the calibration stored with a registered model is not built for
# unlabelled reviews: the summary says so rather than leave the field out.
NO_FORECAST = ("not computed: forecasting the accuracy lost on unlabelled reviews from a registered model's "
               "stored calibration is not built into evaluate yet (ttt-pipeline monitor forecasts served traffic)")


def label_free(cfg: PipelineConfig, tracker, parent: str, model: dict, evaluation: dict, cached: dict[str, bool],
               notes: list[str], t0: float) -> dict:
    """Unlabelled reviews' summary: the label-free grid (evaluation.unlabelled) of the evaluate step's predictions,
    its shares as metrics of the parent run, which ends here; no accuracy, so no registry decision."""
    from ttt_pipeline.evaluation import unlabelled

    grid = unlabelled.label_free_grid(steps.read_predictions([StepOutput(**evaluation)]), cfg.evaluation.confidence)
    notes = [*notes, "unlabelled reviews (data.label_column null): not registered, as no accuracy was measured"]
    tracker.metrics(parent, {**unlabelled.flat_metrics(grid), "n_reviews": grid[0]["n"]})
    tracker.tags(parent, {"labelled": "false", **({"evaluate.notes": "; ".join(notes)} if notes else {})})
    tracker.end(parent)
    return {"mlflow_run_id": parent, "mlflow_tracking_uri": tracker.uri, "experiment_id": tracker.experiment_id,
            "labelled": False, "model": cfg.model.classifier, "model_labels": model["meta"]["model_labels"],
            "n": grid[0]["n"], "default_defense": cfg.evaluation.defense, "confidence": cfg.evaluation.confidence,
            "label_free": grid, "forecast_drop": None, "forecast_note": NO_FORECAST, "notes": notes,
            "cached_tasks": sum(cached.values()), "cached": cached, "model_path": model["path"],
            "wall_s": round(time.perf_counter() - t0, 2), "registry": None, "champion": None}
