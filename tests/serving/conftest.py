"""A saved tiny classifier (tiny random BERT, untrained 3-class head): what the serving tests load."""

from __future__ import annotations

from pathlib import Path

import pytest
from serving_helpers import LABELS


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_bert_dir) -> Path:
    import torch

    from ttt_pipeline.config import ModelConfig
    from ttt_pipeline.modeling.model import build_classifier, save_model

    torch.manual_seed(0)
    model, tok = build_classifier(ModelConfig(name=str(tiny_bert_dir), max_length=48, head_hidden=[16]), LABELS)
    return save_model(model, tok, tmp_path_factory.mktemp("tiny-classifier") / "model")
