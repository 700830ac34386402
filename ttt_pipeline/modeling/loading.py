"""Any stored model, by its kind: a classifier fine-tuned here (`model.py`) or one fine-tuned elsewhere and imported
(`hf_classifier.py`). Its own module, so that neither of the two imports the other."""

from __future__ import annotations

from pathlib import Path

import torch

from ttt_pipeline.modeling.hf_classifier import load_imported
from ttt_pipeline.modeling.model import load_review_classifier, read_meta


def load_model(model_dir: Path, device: str | torch.device = "cpu"):
    """(model, tokenizer) from a folder written by `model.save_model` (a ReviewClassifier) or by
    `hf_classifier.save_imported` (a SequenceClassifier, `ttt-pipeline evaluate --model`); no remote code, no
    pickle."""
    meta = read_meta(model_dir)
    if meta.kind != "review_classifier":
        return load_imported(Path(model_dir), meta, device)
    return load_review_classifier(model_dir, meta, device)
