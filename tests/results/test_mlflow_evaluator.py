"""`mlflow.models.evaluate(..., evaluators=["ttt_robustness"])`: the robustness grid as an MLflow evaluator plugin.

This project's pyfunc of the tiny classifier and a tiny random DistilBERT text-classification pipeline saved as an
MLflow `transformers` model (tests/hf_models.py; slow: that flavour takes half a minute to load), scored on eight
reviews: clean accuracy against each model's own predictions, the report and the per-review predictions in the run
MLflow opened, and the bad inputs' errors. tests/flows/test_evaluate_model.py checks that the metrics equal
`ttt-pipeline evaluate`'s on the same data and settings.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from hf_models import save_classifier

from ttt_pipeline.errors import ConfigError, PipelineError

REVIEWS = ["Great sound and the battery lasts all day.", "Stopped working after a week. Very disappointed.",
           "It is fine, nothing special, works as described", "terrible, returned it the next day",
           "Love it, my kids use it every day", "The screen cracked on the first drop",
           "Excellent value for the money", "Broke after two uses and support never answered"]
RATINGS = [5, 1, 4, 2, 5, 1, 4, 1]  # the demo preset's label_map: 1-2 stars negative, 4-5 positive
LABELS = ["positive" if r >= 4 else "negative" for r in RATINGS]


def tiny_settings(tmp: Path) -> dict:
    """The demo preset, cut to one corrupted set and two methods."""
    return {"store": str(tmp / "store"), "data.max_train_samples": 40,
            "corruption.families": ["keyboard"], "corruption.severities": [3], "ttt.methods": ["none", "spell"]}


@pytest.fixture(scope="module")
def logged(tmp_path_factory, make_tiny_clf) -> dict:
    """A sqlite tracking store, and the tiny classifier as this project's pyfunc (what a run registers)."""
    from ttt_pipeline.classifier import inference_config
    from ttt_pipeline.io.mlflow_model import save_classifier_model
    from ttt_pipeline.modeling.model import save_model

    root = tmp_path_factory.mktemp("evaluator")
    model, tok = make_tiny_clf(("negative", "positive"), head_dropout=0.0)
    folder = save_model(model, tok, root / "classifier")
    path = save_classifier_model(folder, root / "own-model", inference_config(method="spell"))
    return {"root": root, "uri": str(path), "tracking": f"sqlite:///{root / 'mlflow.db'}"}


@pytest.fixture(scope="module")
def hf_model(logged) -> dict:
    """A tiny random DistilBERT pipeline saved as an MLflow transformers model."""
    import mlflow
    from transformers import pipeline

    folder = save_classifier(logged["root"] / "hf", "distilbert")
    pipe = pipeline("text-classification", model=str(folder))
    mlflow.transformers.save_model(pipe, str(logged["root"] / "mlflow-model"), pip_requirements=["transformers", "torch"])
    return {"uri": str(logged["root"] / "mlflow-model"), "pipe": pipe}


def evaluate(logged: dict, data: pd.DataFrame, settings: dict, model: str | None = None, **kwargs):
    import mlflow

    mlflow.set_tracking_uri(logged["tracking"])
    try:
        with mlflow.start_run() as run:
            result = mlflow.models.evaluate(model or logged["uri"], data, targets="label", model_type="classifier",
                                            evaluators=["ttt_robustness"],
                                            evaluator_config={"ttt_robustness": settings}, **kwargs)
        return result, run.info.run_id
    finally:
        mlflow.set_tracking_uri(None)


@pytest.mark.slow
def test_the_plugin_scores_the_dataframe_and_logs_its_report_and_predictions(logged, hf_model):
    import mlflow

    data = pd.DataFrame({"review": REVIEWS, "label": RATINGS})
    result, run_id = evaluate(logged, data, {**tiny_settings(logged["root"]), "data.text_column": "review"},
                              model=hf_model["uri"])
    expected = sum(p["label"] == y for p, y in zip(hf_model["pipe"](REVIEWS), LABELS)) / len(LABELS)
    assert result.metrics["acc/clean/none"] == pytest.approx(expected)
    assert result.metrics["acc_clean"] == result.metrics["acc/clean/none"]
    # metric names grouped by set (acc/<family>/<severity>/<method>); each interval as its own two metrics
    assert {"acc/keyboard/3/none", "acc/keyboard/3/spell", "corruption_drop", "corruption_drop_ci_low",
            "corruption_drop_ci_high", "gain/keyboard/3/spell_ci_low", "worst/spell"} <= set(result.metrics)
    low, high = result.metrics["corruption_drop_ci_low"], result.metrics["corruption_drop_ci_high"]
    assert low <= result.metrics["corruption_drop"] <= high
    assert not any(k.startswith("samples_per_s/") for k in result.metrics)  # timings vary; figures do not
    client = mlflow.MlflowClient(logged["tracking"])
    run = client.get_run(run_id)
    assert run.data.metrics["acc/clean/none"] == result.metrics["acc/clean/none"]
    assert {"report.html", "predictions.parquet"} <= {a.path for a in client.list_artifacts(run_id)}
    assert result.artifacts["report"].uri.endswith("/report.html")
    preds = pd.read_parquet(mlflow.artifacts.download_artifacts(result.artifacts["predictions"].uri,
                                                                 tracking_uri=logged["tracking"]))
    clean = preds[(preds["set"] == "clean") & (preds["method"] == "none")].sort_values("index")
    assert len(clean) == len(REVIEWS)  # every row given is scored: the preset's test cap does not apply
    assert clean["label"].tolist() == [int(y == "positive") for y in LABELS]
    # MLflow's own thresholds read the returned metrics
    from mlflow.exceptions import MlflowException
    from mlflow.models import MetricThreshold

    mlflow.validate_evaluation_results({"acc_clean": MetricThreshold(threshold=0.0, greater_is_better=True)}, result)
    with pytest.raises(MlflowException, match="acc_clean"):
        mlflow.validate_evaluation_results({"acc_clean": MetricThreshold(threshold=1.01, greater_is_better=True)},
                                           result)


def test_a_frame_with_several_columns_and_no_text_column_names_them(logged):
    data = pd.DataFrame({"body": REVIEWS, "title": REVIEWS, "label": RATINGS})
    with pytest.raises(ConfigError, match=r"no text column 'text' among the features \['body', 'title'\]"):
        evaluate(logged, data, tiny_settings(logged["root"]))


def test_labels_outside_the_class_names_name_the_field_to_set(logged):
    data = pd.DataFrame({"text": REVIEWS, "label": ["good" if r >= 4 else "bad" for r in RATINGS]})
    with pytest.raises(PipelineError) as err:
        evaluate(logged, data, tiny_settings(logged["root"]))
    assert err.value.message.startswith("the evaluation DataFrame: labels ['bad', 'good']")
    assert "evaluator_config['data.label_map']=null" in err.value.hint and "--set" not in err.value.hint


def test_a_pyfunc_without_a_text_classifier_is_refused_naming_its_loader(logged, tmp_path):
    import mlflow

    class Constant(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input, params=None):
            return ["positive"] * len(model_input)

    mlflow.pyfunc.save_model(str(tmp_path / "constant"), python_model=Constant(), pip_requirements=[])
    data = pd.DataFrame({"text": REVIEWS, "label": RATINGS})
    with pytest.raises(ConfigError, match="holds no Hugging Face text classifier") as err:
        evaluate(logged, data, tiny_settings(logged["root"]), model=str(tmp_path / "constant"))
    assert "mlflow.pyfunc.model" in str(err.value) and "transformers" in err.value.hint


def test_a_regressor_is_not_this_evaluators_kind():
    from ttt_pipeline.io.mlflow_evaluator import RobustnessEvaluator

    assert RobustnessEvaluator.can_evaluate(model_type="classifier", evaluator_config={})
    assert not RobustnessEvaluator.can_evaluate(model_type="regressor", evaluator_config={})


def test_this_projects_pyfunc_is_scored_from_its_classifier_folder(logged):
    """The pyfunc a run logs (the demo champion's kind): clean accuracy equals its own predictions'."""
    from ttt_pipeline.io.mlflow_model import load_classifier

    result, _ = evaluate(logged, pd.DataFrame({"text": REVIEWS, "label": RATINGS}), tiny_settings(logged["root"]))
    probs = load_classifier(logged["uri"]).predict_proba(REVIEWS, method="none", precision="fp32")
    expected = sum(["negative", "positive"][p.argmax()] == y for p, y in zip(probs, LABELS)) / len(LABELS)
    assert result.metrics["acc/clean/none"] == pytest.approx(expected)
    assert {"acc/keyboard/3/spell", "gain/keyboard/3/spell"} <= set(result.metrics)
