"""`steps.kept`: what a stopped run tells the user the store keeps for its config, in pipeline order."""

from __future__ import annotations

import json
from pathlib import Path

from tiny_config import tiny_config

from ttt_pipeline import steps
from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.storage import StepStore


def test_kept_lists_the_stored_steps_and_an_interrupted_finetunes_checkpoint(tmp_path, tiny_bert_dir):
    cfg = PipelineConfig.model_validate(tiny_config(tmp_path, tiny_bert_dir, finetune={"epochs": 4}))
    store = StepStore(cfg.store)
    assert steps.kept(cfg, store) == []
    data = steps.download(cfg, store)
    tokens = steps.tokenise(cfg, data, store)
    assert steps.kept(cfg, store) == ["download", "tokenise"]
    inputs = steps.finetune_inputs(cfg, tokens, data)
    work = Path(cfg.store) / "finetune" / f"{StepStore.key('finetune', inputs, steps.version('finetune'))}.work"
    work.mkdir(parents=True)
    (work / "state.json").write_text(json.dumps({"history": [{"epoch": 1}, {"epoch": 2}]}))
    assert steps.kept(cfg, store)[-1] == "tokenise"  # a state without its checkpoint resumes nothing
    (work / "last.pt").write_bytes(b"")
    steps.corrupt(cfg, data, store)
    assert steps.kept(cfg, store) == ["download", "tokenise", "finetune's checkpoint after epoch 2 of 4", "corrupt"]
    other = cfg.model_copy(update={"finetune": cfg.finetune.model_copy(update={"lr": 1e-3})})
    assert steps.kept(other, store) == ["download", "tokenise", "corrupt"]  # another model's checkpoint is not ours
