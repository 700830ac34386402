"""The pipeline's Prefect tasks. Each calls one pure step of `ttt_pipeline.steps` and returns a JSON-able
StepOutput dict (paths and digests, never models or datasets).

Cache policy: the key is the step's store key plus the digest of its verified stored output. A missing or
damaged store entry gives no key, so the task runs (and rebuilds) instead of serving a stale path.
"""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from ttt_pipeline import steps
from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.io import step_logging
from ttt_pipeline.io.tracking import Tracker

from .common import COMMON, _out, _store, step_cache
from .progress import Reporter


def may_pass(task, task_run, state) -> bool:
    """Prefect retry condition: retry what may pass on a second try (a remote source that failed to download,
    an unexpected error), never a user error (a missing column, a bad value, a refused file), which fails the
    same way every time and is reported at once."""
    from ttt_pipeline.errors import DownloadError, PipelineError

    try:
        state.result()
    except DownloadError:
        return True
    except PipelineError:
        return False
    except Exception:
        return True
    return True


@task(name="download", cache_key_fn=step_cache("download", lambda p: steps.download_inputs(p["cfg"])),
      retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=may_pass, **COMMON)
def download_task(cfg: PipelineConfig) -> dict:
    """Retried when a remote source fails (transiently, often); errors in the config or the data fail at once."""
    return steps.download(cfg, _store(cfg)).to_dict()


@task(name="tokenise", cache_key_fn=step_cache("tokenise", lambda p: steps.tokenise_inputs(p["cfg"], _out(p["data"]))),
      **COMMON)
def tokenise_task(cfg: PipelineConfig, data: dict) -> dict:
    return steps.tokenise(cfg, _out(data), _store(cfg)).to_dict()


@task(name="finetune", cache_key_fn=step_cache(
    "finetune", lambda p: steps.finetune_inputs(p["cfg"], _out(p["tokens"]), _out(p["data"]))), **COMMON)
def finetune_task(cfg: PipelineConfig, data: dict, tokens: dict) -> dict:
    rep = Reporter("finetune-progress")
    try:
        return steps.finetune(cfg, _out(data), _out(tokens), _store(cfg), rep).to_dict()
    finally:
        rep.close()


@task(name="import-model", retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=may_pass,
      cache_policy=NO_CACHE)
def import_model_task(cfg: PipelineConfig, data: dict) -> dict:
    """A classifier fine-tuned elsewhere (model.classifier), fetched (an MLflow model is downloaded each time;
    its files key the store entry, which serves a repeat) and stored as the pipeline's model folder."""
    from ttt_pipeline.io.model_source import fetched

    with fetched(cfg.model.classifier, cfg.tracking.tracking_uri) as source:
        return steps.import_model(cfg, _out(data), source, _store(cfg)).to_dict()


@task(name="corrupt", cache_key_fn=step_cache("corrupt", lambda p: steps.corrupt_inputs(p["cfg"], _out(p["data"]))),
      **COMMON)
def corrupt_task(cfg: PipelineConfig, data: dict) -> dict:
    return steps.corrupt(cfg, _out(data), _store(cfg)).to_dict()


@task(name="evaluate", cache_key_fn=step_cache("evaluate", lambda p: steps.evaluate_inputs(
    p["cfg"], _out(p["data"]), _out(p["model"]), _out(p["corrupted"]), p.get("families"))), **COMMON)
def evaluate_task(cfg: PipelineConfig, data: dict, model: dict, corrupted: dict,
                  families: list[str] | None = None) -> dict:
    rep = Reporter("evaluation-progress")
    try:
        return steps.evaluate(cfg, _out(data), _out(model), _out(corrupted), _store(cfg), families, rep).to_dict()
    finally:
        rep.close()


def _calibrate_inputs(p: dict) -> dict:
    return steps.calibrate_inputs(p["cfg"], _out(p["data"]), _out(p["model"]), _out(p["corrupted"]),
                                  [_out(e) for e in p["evaluations"]])


@task(name="calibrate", cache_key_fn=step_cache("calibrate", _calibrate_inputs), **COMMON)
def calibrate_task(cfg: PipelineConfig, data: dict, model: dict, corrupted: dict, evaluations: list[dict]) -> dict:
    """The label-free drop forecast calibrated on the run's corrupted sets (`steps.calibrate`): its StepOutput, or
    {"skipped": why} when the run cannot calibrate it (a default defense without a text repair, one family)."""
    from ttt_pipeline.io.remote_store import localise

    reason = steps.calibration_skip_reason(cfg, _out(corrupted))
    if reason is not None:
        get_run_logger().info("calibrate: skipped: %s", reason)
        return {"skipped": reason}
    store = _store(cfg)
    data, model, corrupted = (localise(store, d) for d in (data, model, corrupted))  # no-op on a local store
    evaluations = [localise(store, e) for e in evaluations]
    return steps.calibrate(cfg, _out(data), _out(model), _out(corrupted), [_out(e) for e in evaluations],
                           store).to_dict()


@task(name="log-calibration", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[1, 5])
def log_calibration_task(cfg: PipelineConfig, calibration: dict, parent_run_id: str) -> dict:
    """The calibration on the parent MLflow run (io.calibration_store), logged from the stored output (a cached
    calibration too): the run summary's `forecast_calibration` ({model, loo_mae, coverage, n_sets}; None when
    skipped) and `forecast_calibration_note` (why it was skipped; None when it was not)."""
    from ttt_pipeline.io.calibration_store import log_calibration

    if "skipped" in calibration:
        return {"forecast_calibration": None, "forecast_calibration_note": calibration["skipped"]}
    payload = steps.read_calibration(_out(calibration))
    log_calibration(Tracker.from_config(cfg.tracking), parent_run_id, payload)
    return {"forecast_calibration": steps.calibration_summary(payload), "forecast_calibration_note": None}


@task(name="new-reviews", cache_key_fn=step_cache("new-reviews", lambda p: steps.new_reviews_inputs(
    p["cfg"], _out(p["data"]), _out(p["model"]), p["defense"])), **COMMON)
def new_reviews_task(cfg: PipelineConfig, data: dict, model: dict, defense: str) -> dict:
    """The champion on `nightly.data_path`'s newest labelled reviews (`steps.score_new_reviews`)."""
    return steps.score_new_reviews(cfg, _out(data), _out(model), defense, _store(cfg)).to_dict()


@task(name="report", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[1, 5])
def report_task(cfg: PipelineConfig, data: dict, corrupted: dict, evaluations: list[dict], parent_run_id: str,
                logged: dict) -> dict:
    """The run's HTML report of the reviews the noise flipped (steps.flip_report), logged to the parent run;
    {"report": its artifact URI}."""
    page = steps.flip_report(cfg, _out(data), _out(corrupted), [_out(e) for e in evaluations],
                             {**logged["headline"], **logged["stats"]})
    return {"report": step_logging.log_report(Tracker.from_config(cfg.tracking), parent_run_id, page)}


@task(name="log-step", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[1, 5])
def log_step_task(cfg: PipelineConfig, stage: str, outputs: list[dict], parent_run_id: str,
                   cached: bool) -> dict:
    """One MLflow child run per stage, logged from the stored output (so cached stages are logged too)."""
    tracker = Tracker.from_config(cfg.tracking)
    outs = [_out(o) for o in outputs]
    for o in outs:
        o.cached = cached
    run_id = tracker.start(stage, parent=parent_run_id)
    logged: dict = {"headline": {}}
    try:
        if stage == "download":
            step_logging.log_download(tracker, run_id, outs[0], cfg)
        elif stage == "tokenise":
            step_logging.log_tokenise(tracker, run_id, outs[0], cfg)
        elif stage == "finetune":
            step_logging.log_finetune(tracker, run_id, outs[0], cfg, cfg.tracking.log_model,
                                       outs[1] if len(outs) > 1 else None)  # [model, data]
        elif stage == "import-model":
            step_logging.log_import(tracker, run_id, outs[0], cfg, cfg.tracking.log_model, outs[1])
        elif stage == "corrupt":
            step_logging.log_corrupt(tracker, run_id, outs[0], cfg)
        elif stage == "evaluate":
            results = steps.load_results(outs)
            reference = step_logging.reference_rows(tracker, cfg.evaluation.reference)
            logged = step_logging.log_evaluate(tracker, run_id, outs, results, cfg, reference)
            _grid_artifact(results["rows"], logged["comparisons"])
        elif stage == "attribute":
            from .attribution import log_attribute

            log_attribute(tracker, run_id, outs[0], cfg)
        else:
            raise ValueError(f"unknown stage {stage!r}")
    except Exception:
        tracker.end(run_id, "FAILED")
        raise
    tracker.end(run_id)
    return {"run_id": run_id, **{k: v for k, v in logged.items() if k not in ("flat", "metrics")},
            "flat": logged.get("flat", {})}


def _grid_artifact(rows: list[dict], comparisons: list[dict]) -> None:
    """The evaluation grid as a Prefect table artifact (one row per test set and method, with each method's
    paired difference from `none` and its verdict)."""
    from prefect.artifacts import create_table_artifact

    from ttt_pipeline.io.plots import grid_table

    try:
        create_table_artifact(grid_table(rows, comparisons), key="evaluation-grid",
                              description="Accuracy of every test set under every method; differences from "
                                          "no adaptation with 95% paired bootstrap intervals")
    except Exception as exc:  # the UI table is for people; MLflow holds the numbers already
        import logging

        logging.getLogger(__name__).warning("evaluation-grid artifact not created: %s", exc)
