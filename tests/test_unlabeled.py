"""Unlabeled texts for dapt (finetune.unlabeled_path): read, tokenised, keyed by content, and trained on."""

from __future__ import annotations

import json
import math

import pytest
import torch
from pydantic import ValidationError
from tiny_config import tiny_config

from ttt_pipeline import steps
from ttt_pipeline.config import FinetuneConfig, ModelConfig, PipelineConfig
from ttt_pipeline.errors import DataError
from ttt_pipeline.storage import StepOutput

TEXTS = ["the kettle boils fast and the lid seals well", "blender blade cracked in a week",
         "sturdy pan , even heat , easy to clean", "the knife dulled after two uses"]


def write_jsonl(path, texts, column="text"):
    path.write_text("".join(json.dumps({column: t, "other": 1}) + "\n" for t in texts))
    return path


def dapt_config(tmp_path, tiny_bert_dir, unlabeled, **ft):
    return PipelineConfig.model_validate(tiny_config(tmp_path, tiny_bert_dir, finetune={
        "alignment": "dapt", "dapt_epochs": 1, "unlabeled_path": str(unlabeled), **ft}))


def test_unlabeled_path_needs_dapt(tmp_path, tiny_bert_dir):
    path = write_jsonl(tmp_path / "u.jsonl", TEXTS)
    for bad in ({"alignment": "joint"}, {"alignment": "dapt", "dapt_epochs": 0}):
        with pytest.raises(ValidationError, match="finetune.unlabeled_path is only read by dapt"):
            PipelineConfig.model_validate(tiny_config(tmp_path, tiny_bert_dir,
                                                      finetune={"unlabeled_path": str(path), **bad}))


def test_unlabeled_texts_are_read_tokenised_and_key_the_model(tmp_path, tiny_bert_dir):
    from ttt_pipeline.modeling.model import build_classifier
    from ttt_pipeline.modeling.tokenize import lengths_dataset

    path = write_jsonl(tmp_path / "u.jsonl", TEXTS + ["", "   "])
    cfg = dapt_config(tmp_path, tiny_bert_dir, path)
    _, tok = build_classifier(cfg.model, ["a", "b"])
    ds = lengths_dataset(tok, steps.unlabeled_texts(cfg), cfg.model.max_length)
    assert len(ds) == 4  # blank texts dropped
    assert ds["length"] == [len(tok(t)["input_ids"]) for t in TEXTS]
    assert ds["input_ids"][0][0] == tok.cls_token_id

    up = StepOutput("x", "k", str(tmp_path), "d")
    before = steps.finetune_inputs(cfg, up, up)
    assert steps.finetune_inputs(cfg, up, up) == before
    write_jsonl(path, TEXTS[:3])  # same path, other content: another model
    assert steps.finetune_inputs(cfg, up, up)["unlabeled"] != before["unlabeled"]

    with pytest.raises(DataError, match="finetune.unlabeled_path"):
        steps.finetune_inputs(dapt_config(tmp_path, tiny_bert_dir, tmp_path / "missing.jsonl"), up, up)
    other = write_jsonl(tmp_path / "v.jsonl", TEXTS, column="body")
    with pytest.raises(DataError, match="no column 'text'"):
        steps.unlabeled_texts(dapt_config(tmp_path, tiny_bert_dir, other))


def test_dapt_may_be_followed_by_plain_epochs_joint_may_not(tmp_path, tiny_bert_dir):
    ok = PipelineConfig.model_validate(tiny_config(tmp_path, tiny_bert_dir, finetune={"alignment": "dapt",
                                                                                      "mlm_weight": 0}))
    assert ok.finetune.mlm_weight == 0
    with pytest.raises(ValidationError, match="finetune.mlm_weight must be > 0 with alignment joint"):
        PipelineConfig.model_validate(tiny_config(tmp_path, tiny_bert_dir, finetune={"alignment": "joint",
                                                                                     "mlm_weight": 0}))


@pytest.mark.parametrize("precision, mlm_weight", [("auto", 0.5), ("bf16", 0.0)])
def test_dapt_trains_on_training_and_unlabeled_texts(tiny_bert_dir, tmp_path, precision, mlm_weight):
    from datasets import Dataset

    from ttt_pipeline.modeling.model import build_classifier
    from ttt_pipeline.modeling.train import finetune

    torch.manual_seed(0)
    model, tok = build_classifier(ModelConfig(name=str(tiny_bert_dir), head_hidden=[16]), ["neg", "pos"])
    enc = tok(TEXTS * 2, truncation=True, max_length=16)["input_ids"]
    ds = Dataset.from_dict({"input_ids": enc, "label": [0, 1] * 4, "length": [len(x) for x in enc]})
    unl_ids = tok(TEXTS * 4, truncation=True, max_length=16)["input_ids"]
    unl = Dataset.from_dict({"input_ids": unl_ids, "length": [len(x) for x in unl_ids]})
    cfg = FinetuneConfig(epochs=1, batch_size=4, lr=1e-3, alignment="dapt", dapt_epochs=2, dapt_lr=1e-3,
                         early_stopping_patience=0, seed=0, precision=precision, mlm_warmup_max_steps=0,
                         mlm_weight=mlm_weight)
    result = finetune(model, tok, ds, None, cfg, tmp_path / "work", unlabeled_ds=unl)
    assert len(result.dapt_curve) == 2 * math.ceil((8 + 16) / 4)  # both sets, every epoch
    assert all(math.isfinite(v) for v in result.dapt_curve)
    assert sum(result.dapt_curve[-6:]) < sum(result.dapt_curve[:6])  # the MLM loss falls
    # joint epochs after the MLM stage, or plain ones with mlm_weight 0
    assert ("train_mlm_loss" in result.history[-1]) == (mlm_weight > 0)
