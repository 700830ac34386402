"""Data-parallel fine-tuning: torchrun, 2 CPU processes, gloo, the tiny BERT of tests/conftest.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_config import tiny_config

from ttt_pipeline.config import PipelineConfig

pytestmark = pytest.mark.slow


def test_sharded_batches_split_every_epoch_evenly():
    from ttt_pipeline.modeling.data_parallel import ShardedBatches
    from ttt_pipeline.modeling.train import WeightedLengthGroupedBatches

    inner = WeightedLengthGroupedBatches(None, list(range(5, 75)), 8, seed=3)  # 70 rows -> 9 batches
    shards = [ShardedBatches(inner, r, 2) for r in range(2)]
    for epoch in (0, 1):
        for s in shards:
            s.set_epoch(epoch)
        got = [list(s) for s in shards]
        assert [len(g) for g in got] == [5, 5] == [len(s) for s in shards]
        everything = list(inner)
        assert got[0] + got[1] != [] and sorted(map(tuple, got[0][:4] + got[1][:4])) == sorted(
            map(tuple, everything[:8]))  # disjoint halves of the same batch list (padded by wrapping)
        assert got[0][0] == everything[0] and got[1][0] == everything[1]


def test_two_gloo_ranks_train_identical_weights(tmp_path, tiny_bert_dir):
    from ttt_pipeline import steps
    from ttt_pipeline.storage import StepStore
    from ttt_pipeline.tasks.distributed import launch_finetune

    raw = tiny_config(tmp_path, tiny_bert_dir, suite="ops")
    raw["data"]["max_train_samples"] = 64
    raw["finetune"].update({"epochs": 4, "batch_size": 8, "lr": 2e-3, "warmup_ratio": 0.0,
                            "weighted_sampler": False, "length_grouping": False, "mlm_warmup_max_steps": 5})
    cfg = PipelineConfig.model_validate(raw)
    store = StepStore(cfg.store)
    data = steps.download(cfg, store)
    tokens = steps.tokenise(cfg, data, store)
    dump = tmp_path / "ranks"
    launch_finetune(cfg, data.to_dict(), tokens.to_dict(), nproc=2, extra_args=("--dump-weights", str(dump)),
                    timeout_s=600)

    r0, r1 = (torch.load(dump / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["world"] == r1["world"] == 2
    assert r0["weights"].keys() == r1["weights"].keys()
    for k in r0["weights"]:
        assert torch.equal(r0["weights"][k], r1["weights"][k]), k  # gradients averaged: ranks never diverge
    n_train = data.meta["sizes"]["train"]
    per_epoch = -(-n_train // 8)  # batches of one process training alone
    assert r0["batches"] == r1["batches"] == 4 * -(-per_epoch // 2)  # each rank took half of every epoch

    out = steps.stored("finetune", steps.finetune_inputs(cfg, tokens, data), store)
    assert out is not None, "rank 0 wrote the step output into the store"
    losses = [e["train_loss"] for e in json.loads((Path(out.path) / "history.json").read_text())["epochs"]]
    assert len(losses) == 4 and losses[-1] < losses[0], losses
