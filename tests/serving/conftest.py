"""A saved tiny classifier (tiny random BERT, untrained 3-class head): what the serving tests load."""

from __future__ import annotations

from pathlib import Path

import pytest
from serving_helpers import LABELS


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, make_tiny_clf) -> Path:
    from ttt_pipeline.modeling.model import save_model

    model, tok = make_tiny_clf(LABELS, head_dropout=0.0)
    return save_model(model, tok, tmp_path_factory.mktemp("tiny-classifier") / "model")
