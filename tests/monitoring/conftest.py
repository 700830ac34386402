"""The tiny classifier logged as an MLflow Model with `spell` as its default defense and a training vocabulary:
what the capture tests load through the pyfunc, as the serving tests load theirs."""

from __future__ import annotations

from pathlib import Path

import pytest
from monitoring_helpers import LABELS, TEXTS


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, make_tiny_clf) -> Path:
    from ttt_pipeline.modeling.model import save_model

    model, tok = make_tiny_clf(LABELS, head_dropout=0.0)
    return save_model(model, tok, tmp_path_factory.mktemp("tiny-classifier") / "model")


@pytest.fixture(scope="session")
def spell_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The MLflow Model folder: method spell (the default defense), vocabulary of the texts."""
    from ttt_pipeline.classifier import inference_config
    from ttt_pipeline.defenses.vocabulary import training_vocabulary
    from ttt_pipeline.io.mlflow_model import save_classifier_model

    return save_classifier_model(tiny_model_dir, tmp_path_factory.mktemp("mlflow-model") / "model",
                                 inference_config(method="spell"), training_vocabulary(TEXTS * 2))
