"""tokenise: the reviews as token ids at model.max_length."""

from __future__ import annotations

from pathlib import Path

from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.steps.guards import guarded
from ttt_pipeline.steps.keys import tokenise_inputs, version
from ttt_pipeline.storage import StepOutput, StepStore


def tokenise(cfg: PipelineConfig, data: StepOutput, store: StepStore) -> StepOutput:
    from ttt_pipeline.data.prepare import load_prepared
    from ttt_pipeline.modeling.tokenize import load_tokenizer, tokenize_dataset

    inputs = tokenise_inputs(cfg, data)

    def build(tmp: Path) -> dict:
        ds, _ = load_prepared(data.path)
        tok = load_tokenizer(cfg.model.name, cfg.model.trust_remote_code)
        return tokenize_dataset(ds, tok, cfg.model.max_length, tmp)

    return store.run("tokenise", inputs, guarded(cfg, "tokenise", build), version("tokenise"))
