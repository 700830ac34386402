"""CUDA out-of-memory, simulated on CPU: the batch is halved once (warning + recorded), never retried blindly."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from tiny_config import tiny_config

from ttt_pipeline import steps
from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.errors import PipelineError
from ttt_pipeline.modeling import oom
from ttt_pipeline.modeling.oom import run_with_oom_fallback
from ttt_pipeline.modeling.train import TrainResult
from ttt_pipeline.storage import StepStore


def _cuda_oom() -> torch.cuda.OutOfMemoryError:
    return torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.fixture()
def fake_cuda(monkeypatch):
    """Pretend a GPU is there, so the cache-emptying path runs; count the calls."""
    emptied = []
    monkeypatch.setattr(oom.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(oom.torch.cuda, "empty_cache", lambda: emptied.append(1))
    return emptied


def test_oom_halves_the_batch_once_warns_and_records(fake_cuda, caplog):
    sizes = []

    def train(batch_size):
        sizes.append(batch_size)
        if batch_size > 16:
            raise _cuda_oom()
        return "trained"

    with caplog.at_level(logging.WARNING, logger="ttt_pipeline.modeling.oom"):
        result, meta = run_with_oom_fallback(train, 32)
    assert result == "trained" and sizes == [32, 16]
    assert meta == {"oom_halved_batch_size": 16, "oom_original_batch_size": 32}
    assert fake_cuda == [1]  # the cache was emptied before the retry
    assert any("batch size 32" in r.getMessage() and "batch size 16" in r.getMessage() for r in caplog.records)


def test_no_oom_means_no_metadata():
    assert run_with_oom_fallback(lambda b: b * 2, 8) == (16, {})


def test_second_oom_is_a_clear_error_not_a_loop(fake_cuda):
    sizes = []

    def train(batch_size):
        sizes.append(batch_size)
        raise _cuda_oom()

    with pytest.raises(PipelineError) as exc:
        run_with_oom_fallback(train, 32)
    assert sizes == [32, 16]
    assert "batch size 32 and again at 16" in exc.value.message and "finetune.batch_size" in exc.value.hint
    with pytest.raises(PipelineError, match="batch size 1"):
        run_with_oom_fallback(train, 1)


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError("shape mismatch"), ValueError("bug")])
def test_other_errors_are_never_retried(error):
    calls = []

    def train(batch_size):
        calls.append(batch_size)
        raise error

    with pytest.raises(type(error)):
        run_with_oom_fallback(train, 32)
    assert calls == [32]


def test_finetune_step_falls_back_and_records_it(tmp_path, tiny_bert_dir, monkeypatch):
    """The hook in steps.finetune: an OOM at batch 16 retrains at 8, from a fresh model and its own checkpoints."""
    import ttt_pipeline.modeling.train as train_mod

    cfg = PipelineConfig.model_validate(tiny_config(tmp_path, tiny_bert_dir, suite="reliability",
                                                    data={"max_train_samples": 30}))
    store = StepStore(cfg.store)
    data = steps.download(cfg, store)
    tokens = steps.tokenise(cfg, data, store)
    seen = []

    def fake_train(model, tokenizer, train_ds, val_ds, ft_cfg, work_dir, progress=None, unlabeled_ds=None,
                   parallel=None, runtime=None):
        seen.append((ft_cfg.batch_size, Path(work_dir).name, model))  # holds the model: ids stay unique
        if ft_cfg.batch_size == 16:
            raise _cuda_oom()
        return TrainResult(history=[{"epoch": 1, "val_acc": 0.5}], best_epoch=1)

    monkeypatch.setattr(train_mod, "finetune", fake_train)
    out = steps.finetune(cfg, data, tokens, store)
    assert [s[0] for s in seen] == [16, 8]
    assert seen[0][1].endswith(".work") and seen[1][1] == "oom-batch-8"
    assert seen[0][2] is not seen[1][2]  # a fresh model for the retry
    assert out.meta["oom_halved_batch_size"] == 8 and out.meta["oom_original_batch_size"] == 16
    manifest = json.loads((Path(out.path) / "manifest.json").read_text())
    assert manifest["meta"]["oom_halved_batch_size"] == 8
    assert cfg.finetune.batch_size == 16  # the config itself is untouched


def test_no_lone_retry_in_data_parallel_training(monkeypatch):
    """Under torchrun one rank halving its batch alone would hang the others: report instead."""
    monkeypatch.setattr(oom, "_distributed", lambda: True)
    calls = []

    def train(batch_size):
        calls.append(batch_size)
        raise _cuda_oom()

    with pytest.raises(PipelineError, match="data-parallel"):
        run_with_oom_fallback(train, 32)
    assert calls == [32]
