"""Data-parallel fine-tuning goes through torch's DistributedDataParallel around `train.TrainingLoss`: with one
gloo rank (in this process) it trains bit for bit like single-process training, in the alignments that use every
trainable parameter (joint) and in the one that leaves the MLM head without gradients (frozen:
find_unused_parameters). tests/ops/test_ddp_gloo.py runs two ranks under torchrun."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ttt_pipeline.config import FinetuneConfig, ModelConfig


def _train(model_dir, work, cfg, parallel=None):
    from datasets import Dataset

    from ttt_pipeline.modeling.model import build_classifier
    from ttt_pipeline.modeling.train import finetune

    torch.manual_seed(0)
    model, tok = build_classifier(ModelConfig(name=str(model_dir), head_hidden=[16]), ["neg", "pos"])
    texts = ["great excellent love it", "terrible broken awful", "love it great value", "awful waste of money"] * 5
    enc = tok(texts, truncation=True, max_length=16)
    ds = Dataset.from_dict({"input_ids": enc["input_ids"], "label": [1, 0, 1, 0] * 5,
                            "length": [len(x) for x in enc["input_ids"]]})
    result = finetune(model, tok, ds, ds, cfg, work, parallel=parallel)
    history = [{k: v for k, v in row.items() if k not in ("epoch_s", "samples_per_s")} for row in result.history]
    return model.state_dict(), history


@pytest.mark.parametrize("alignment,mode,passes", [("joint", "full", 1), ("frozen", "full", 2),
                                                   ("joint", "frozen_encoder", 2)])
def test_one_rank_ddp_trains_exactly_like_one_process(alignment, mode, passes, tiny_bert_dir, tmp_path):
    from ttt_pipeline.modeling.data_parallel import DataParallel
    from ttt_pipeline.modeling.train import TrainingLoss

    cfg = FinetuneConfig(epochs=2, batch_size=8, lr=2e-3, alignment=alignment, mode=mode, joint_passes=passes,
                         early_stopping_patience=0, seed=0, precision="fp32", mlm_warmup_max_steps=0)
    alone_w, alone_h = _train(tiny_bert_dir, tmp_path / "alone", cfg)

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        parallel = DataParallel()
        ddp_w, ddp_h = _train(tiny_bert_dir, tmp_path / "ddp", cfg, parallel)
    finally:
        dist.destroy_process_group()
    assert isinstance(parallel.module, TrainingLoss)
    assert parallel.batches_seen == 2 * 3  # 20 rows in batches of 8, two epochs, counted by a hook on the DDP wrapper
    assert ddp_h == alone_h
    assert ddp_w.keys() == alone_w.keys()
    for k in alone_w:
        assert torch.equal(ddp_w[k], alone_w[k]), k
