"""`mlflow.models.evaluate(model_uri, data, targets=..., model_type="classifier", evaluators=["ttt_robustness"])`:
the robustness grid of `ttt-pipeline evaluate --model` as an MLflow evaluator plugin (the `mlflow.model_evaluator`
entry point in pyproject.toml).

The DataFrame is the test set: it is written once, content-addressed, under the step store, and read as
`data.test_path`; the rest comes from `evaluator_config`, the same settings as `--set` (dotted keys, or sections),
with `config` naming the preset or YAML file they lie over (default: demo, as for the command line). The steps are
the command line's (download, import-model, corrupt, evaluate), in this process and with the same store, so a
repeat is served from it; the evaluation's metrics, statistics, plots and per-review predictions and the run's
`report.html` are logged to the run MLflow opened. Nothing is registered: a team gating with MLflow decides that.

The model is read as MLflow loaded it: this project's pyfunc gives its classifier folder, a `transformers`
text-classification pipeline its model and tokenizer (saved to a temporary folder). Other pyfuncs hold no
Hugging Face classifier to adapt or read probabilities from, and stop with an error that says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator

from mlflow.models.evaluation.base import ModelEvaluator

from ttt_pipeline.errors import ConfigError, PipelineError

MODEL_TYPES = ("classifier",)
TIMING = "samples_per_s/"  # throughput metrics vary run to run; the returned metrics keep only the figures


def settings(evaluator_config: dict[str, Any] | None):
    """The PipelineConfig an evaluation runs with: `config` (a preset or YAML file; default demo) with the other
    keys of evaluator_config on top, as `--set` would lay them. Every row given is scored unless
    data.max_test_samples is set."""
    from ttt_pipeline.config import load_config
    from ttt_pipeline.config.loading import DEFAULT_PRESET

    updates = dict(evaluator_config or {})
    preset = updates.pop("config", None) or DEFAULT_PRESET
    updates.setdefault("data.max_test_samples", None)
    return load_config(preset, updates=updates)


def test_file(features, labels, cfg, root: Path) -> Path:
    """The evaluation DataFrame as a Parquet file under `root`, named by its content (one file per data, so the
    download step's key repeats): the text column (data.text_column, or the only feature column) and the labels
    under data.label_column."""
    import pandas as pd

    text = cfg.data.text_column
    if text not in features.columns:
        if len(features.columns) != 1:
            raise ConfigError(f"data: no text column {text!r} among the features {list(features.columns)}",
                              "set evaluator_config={'data.text_column': 'COLUMN'}, or pass only the text column "
                              "and the targets")
        text = features.columns[0]
    if labels is None:
        raise ConfigError("data: no labels (targets) given", "call mlflow.models.evaluate(..., targets=LABEL_COLUMN)")
    label = cfg.data.label_column or "label"
    frame = pd.DataFrame({"text": features[text].astype(str).tolist(), label: list(labels)})
    body = frame.to_json(orient="records").encode()
    path = root / "evaluator-data" / f"{hashlib.sha256(body).hexdigest()[:16]}.parquet"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        frame.to_parquet(tmp, index=False)
        tmp.replace(path)  # atomic: a concurrent evaluation reads a whole file
    return path


@contextlib.contextmanager
def model_source(model) -> Iterator:
    """The hf_classifier.Source of the model MLflow loaded (a pyfunc.PyFuncModel)."""
    from ttt_pipeline.io.mlflow_model import PyfuncClassifier
    from ttt_pipeline.io.model_source import from_local

    impl = model._model_impl  # MLflow's stable developer API: the flavour's own object
    if isinstance(impl, PyfuncClassifier):
        yield from_local(impl.classifier.source, Path(impl.classifier.source))
        return
    pipeline = getattr(impl, "pipeline", None)
    if pipeline is None or getattr(pipeline, "task", None) not in ("text-classification", "sentiment-analysis"):
        raise ConfigError(f"model: a pyfunc of loader {model.loader_module!r}, which holds no Hugging Face "
                          "text classifier this evaluator can adapt and read probabilities from",
                          "evaluate a model logged by ttt-pipeline, or an mlflow.transformers model of a "
                          "text-classification pipeline")
    with tempfile.TemporaryDirectory(prefix="ttt-evaluator-") as tmp:
        folder = Path(tmp) / "model"
        pipeline.model.save_pretrained(folder)
        pipeline.tokenizer.save_pretrained(folder)
        yield from_local(str(folder), folder)


def run_steps(cfg, source) -> dict:
    """download -> import-model -> corrupt -> evaluate in this process, through the step store."""
    from ttt_pipeline import steps
    from ttt_pipeline.storage import StepStore

    store = StepStore(cfg.store)
    data = steps.download(cfg, store)
    model_out = steps.import_model(cfg, data, source, store)
    scored, notes = steps.evaluated_config(cfg, model_out)
    corrupted = steps.corrupt(scored, data, store)
    evaluation = steps.evaluate(scored, data, model_out, corrupted, store)
    return {"cfg": scored, "notes": notes, "data": data, "corrupted": corrupted, "evaluation": evaluation}


def log_results(run_id: str, done: dict) -> tuple[dict[str, float], dict[str, str]]:
    """The evaluation logged as the evaluate stage logs it, and the report; (metrics, artifact URIs)."""
    import mlflow

    from ttt_pipeline import steps
    from ttt_pipeline.io import step_logging
    from ttt_pipeline.io.tracking import Tracker

    cfg, evaluation = done["cfg"], done["evaluation"]
    tracker = Tracker(mlflow.get_tracking_uri(), cfg.tracking.experiment)
    logged = step_logging.log_evaluate(tracker, run_id, [evaluation], steps.load_results([evaluation]), cfg)
    page = steps.flip_report(cfg, done["data"], done["corrupted"], [evaluation],
                             {**logged["headline"], **logged["stats"]})
    report = step_logging.log_report(tracker, run_id, page)
    if done["notes"]:
        tracker.tags(run_id, {"evaluate.notes": "; ".join(done["notes"])})
    base = report.rsplit("/", 1)[0]
    metrics = {k: float(v) for k, v in logged["metrics"].items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and not k.startswith(TIMING)}
    return metrics, {"report": report, "predictions": f"{base}/predictions.parquet"}


def in_evaluator_terms(exc: PipelineError, path: Path) -> PipelineError:
    """The steps' error as a caller of mlflow.models.evaluate reads it: the DataFrame for the file it was written
    to, evaluator_config entries for `--set` flags."""
    message = exc.message.replace(str(path), "the evaluation DataFrame")
    hint = re.sub(r"--set '?([\w.]+)=([^`'\s]+)'?", r"evaluator_config['\1']=\2", exc.hint or "") or None
    return type(exc)(message, hint)


class RobustnessEvaluator(ModelEvaluator):
    """MLflow's `ModelEvaluator` for `evaluators=["ttt_robustness"]`."""

    @classmethod
    def can_evaluate(cls, *, model_type, evaluator_config, **kwargs) -> bool:
        return model_type in MODEL_TYPES

    def evaluate(self, *, model_type, dataset, run_id, evaluator_config, model=None, **kwargs):
        from mlflow.models.evaluation.artifacts import ParquetEvaluationArtifact, TextEvaluationArtifact
        from mlflow.models.evaluation.base import EvaluationResult

        if model is None:
            raise ConfigError("model: none given; this evaluator scores a model on noisy copies of the data, not "
                              "stored predictions", "call mlflow.models.evaluate(MODEL_URI, data, ...)")
        cfg = settings(evaluator_config)
        path = test_file(dataset.features_data, dataset.labels_data, cfg, Path(cfg.store))
        cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={
            "test_path": str(path), "text_column": "text", "label_column": cfg.data.label_column or "label"})})
        try:
            with model_source(model) as source:
                cfg.model.classifier = source.name
                done = run_steps(cfg, source)
        except PipelineError as exc:
            raise in_evaluator_terms(exc, path) from None
        metrics, uris = log_results(run_id, done)
        return EvaluationResult(metrics=metrics, run_id=run_id, artifacts={
            "report": TextEvaluationArtifact(uris["report"]),
            "predictions": ParquetEvaluationArtifact(uris["predictions"])})
