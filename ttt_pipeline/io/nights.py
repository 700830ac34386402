"""The nightly check's MLflow side: the champion's model version and its files, the previous night's run and its
predictions, and the night's own run (params, metrics, results, the reference predictions tomorrow compares with)."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from ttt_pipeline.config import flatten
from ttt_pipeline.errors import NoChampion, PipelineError
from ttt_pipeline.evaluation.scoring import metric_name
from ttt_pipeline.io.tracking import Tracker

RUN_KIND = "nightly-reevaluation"
REF_PREDICTIONS = "predictions_ref.parquet"
ALIAS = "champion"
log = logging.getLogger(__name__)


def load_champion(client, name: str, alias: str = ALIAS):
    """The model version at `alias` of registered model `name`; NoChampion when there is none."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        # no such model (RESOURCE_DOES_NOT_EXIST) or no such alias (INVALID_PARAMETER_VALUE); anything else is
        # not "no champion" and is raised as it is
        if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
        raise NoChampion(f"registered model {name!r} has no version at alias {alias!r}: no champion yet, "
                         "nothing to re-evaluate",
                         "run the ttt-pipeline deployment once (registry.enabled: true, the default, registers its "
                         "model and makes the first one the champion), or set registry.model_name to the model "
                         "it registers") from None


def judged_version(client, cfg, name: str, tracking_uri: str):
    """The version tonight judges: for a brought model, the one registered from the files its spelling names now
    (a user's alias that moved is followed: io/brought_models.py); else the version at `champion`."""
    from ttt_pipeline.io import brought_models

    if brought_models.is_brought(cfg):
        files = brought_models.current_files(cfg.model.classifier, tracking_uri)
        mv = brought_models.version_of_files(client, name, files, cfg.model.classifier)
        if mv is not None:
            return mv
    return load_champion(client, name)


def model_root(folder: Path) -> Path:
    """The saved classifier's folder inside a downloaded `model` artifact."""
    from ttt_pipeline.modeling.layout import is_model_folder

    for meta in sorted(Path(folder).rglob("meta.json"), key=lambda p: len(p.parts)):
        if is_model_folder(meta.parent):
            return meta.parent
    raise PipelineError(f"no saved classifier (meta.json + head.safetensors or classifier/) under {folder}",
                        "the champion's source must be the `model` artifact logged by the finetune or "
                        "import-model step")


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
            model_root(Path(got)).rename(tmp / "model")
        finally:
            shutil.rmtree(dl, ignore_errors=True)
        return dict(inputs)

    return store.run("champion", inputs, build, "1").to_dict()


def previous_night(tracker: Tracker, model_name: str, night: str):
    """The latest night's run before `night` of this registered model that scored the reference suite."""
    runs = tracker.client.search_runs(
        [tracker.experiment_id],
        f"tags.ttt_run_kind = '{RUN_KIND}' and tags.registered_model = '{model_name}'",
        order_by=["attribute.start_time DESC"], max_results=50)
    for r in runs:
        if r.data.tags.get("night", "") < night and "robust_acc_ref" in r.data.metrics:
            return r
    return None


def training_predictions(tracker: Tracker, mv):
    """The champion's own pipeline run's per-review predictions (its evaluate step), or None."""
    from ttt_pipeline.io.runs import run_predictions

    parent = (mv.tags or {}).get("parent_run_id")
    try:
        if not parent:
            parent = tracker.client.get_run(mv.run_id).data.tags.get("mlflow.parentRunId")
        return run_predictions(tracker.client, tracker.client.get_run(parent)) if parent else None
    except Exception:  # a deleted run, an older run without predictions: no paired baseline
        return None


def baseline_predictions(tracker: Tracker, prev, mv=None):
    """(predictions, what they are) of the paired baseline: the previous night's reference predictions, else (`mv`
    given) the champion's pipeline run's; (None, None) when there is none."""
    import pandas as pd

    if prev is not None:
        with tempfile.TemporaryDirectory(prefix="ttt-prev-") as tmp:
            try:
                frame = pd.read_parquet(tracker.client.download_artifacts(prev.info.run_id, REF_PREDICTIONS, tmp))
            except Exception:  # a night logged before predictions were kept: no paired comparison
                return None, None
        return frame, f"previous night {prev.data.tags.get('night')} (MLflow run {prev.info.run_id})"
    if mv is not None and (frame := training_predictions(tracker, mv)) is not None:
        return frame, f"the champion's pipeline run (v{mv.version}, training time)"
    return None, None


def compare_nights(tracker: Tracker, prev, tonight, threshold: float, cfg, defense: str, mv=None) -> dict | None:
    """Tonight minus the baseline on the reference suite's reviews (ttt_pipeline.evaluation.robustness), paired.
    None when the baseline stored no predictions or scored other reviews. `against` says which baseline it was."""
    from ttt_pipeline.evaluation.robustness import regression_between

    previous, against = baseline_predictions(tracker, prev, mv)
    if previous is None:
        return None
    ev = cfg.evaluation
    check = regression_between(previous, tonight, defense, threshold, resamples=ev.resamples,
                               confidence=ev.confidence, seed=ev.seed)
    return None if check is None else {**check, "against": against}


def start_night(tracker: Tracker, night: str, mv, prev, defense: str, regression: bool, flow_run_id: str) -> str:
    return tracker.start(f"nightly-{night}", tags={
        "ttt_run_kind": RUN_KIND, "night": night, "registered_model": mv.name, "model_version": str(mv.version),
        "model_alias": ALIAS if ALIAS in (getattr(mv, "aliases", None) or [ALIAS]) else "",
        "model_source_run_id": mv.run_id or "", "model_source": mv.source or "",
        "prefect.flow_run_id": flow_run_id, "previous_run_id": prev.info.run_id if prev else "",
        "defense": defense, "regression": str(regression).lower()})


def log_night(tracker: Tracker, run_id: str, cfg, params: dict, now: dict, results: dict, ref_predictions,
              extra: dict, wall_s: float) -> None:
    """Params, metrics, results and the reference predictions (tomorrow's paired comparison reads them)."""
    tracker.params(run_id, {**params,
                            **{f"corruption.{k}": v for k, v in cfg.corruption.model_dump(mode="json").items()
                               if k != "seed"},
                            **flatten(cfg.ttt.model_dump(mode="json"), "ttt.")})
    per_set = {f"{suite}/acc/{metric_name(r)}": r["acc"] for suite, rows in results.items() for r in rows}
    mdd = {"min_detectable_drop": extra["min_detectable_drop"]} if extra.get("min_detectable_drop") is not None else {}
    tracker.metrics(run_id, {**{k: v for k, v in now.items() if v is not None}, **per_set,
                             **_new_reviews_metrics(extra.get("new_data")), **mdd, "wall_s": wall_s})
    tracker.dict(run_id, results, "nightly_results.json")
    if extra.get("reference") is not None:
        tracker.dict(run_id, extra["reference"], "nightly_comparison.json")
    if extra.get("new_data"):
        tracker.dict(run_id, extra["new_data"], "nightly_new_data.json")
    with tempfile.TemporaryDirectory(prefix="ttt-nightly-") as tmp:
        ref_predictions.to_parquet(Path(tmp) / REF_PREDICTIONS, index=False)
        tracker.artifact(run_id, Path(tmp) / REF_PREDICTIONS)


def _new_reviews_metrics(new: dict | None) -> dict:
    if not new:
        return {}
    flat = {f"new_data/{part}/{k}": float(new[part][k]) for part in ("with_defense", "without_defense")
            for k in ("acc", "acc_reference", "delta", "ci_low", "ci_high")}
    flat.update({"new_data/n": new["n"], "new_data/label_share_shift": new["drift"]["label_share_shift"],
                 "new_data/unseen_word_share": new["drift"]["unseen_word_share"]["new"] or 0.0})
    return flat


def tag_version(tracker: Tracker, mv, run_id: str, now: dict) -> None:
    try:
        tracker.client.set_model_version_tag(mv.name, mv.version, "nightly.last_run_id", run_id)
        tracker.client.set_model_version_tag(mv.name, mv.version, "nightly.last_robust_acc_ref",
                                             f"{now['robust_acc_ref']:.4f}")
    except Exception as exc:  # tagging the version is a convenience; the run carries the link anyway
        log.warning("could not tag model version %s/%s: %s", mv.name, mv.version, exc)


def run_link(tracker: Tracker, run_id: str) -> str:
    if tracker.uri.startswith("http"):
        return f"{tracker.uri}/#/experiments/{tracker.experiment_id}/runs/{run_id}"
    return f"experiment {tracker.experiment_id}, run {run_id}"
