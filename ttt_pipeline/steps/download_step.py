"""download: read, check and split the reviews (`data/prepare.py`) into the store."""

from __future__ import annotations

from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.steps.guards import guarded
from ttt_pipeline.steps.keys import download_inputs, version
from ttt_pipeline.storage import StepOutput, StepStore


def download(cfg: PipelineConfig, store: StepStore) -> StepOutput:
    from ttt_pipeline.data.prepare import prepare_dataset

    return store.run("download", download_inputs(cfg),
                     guarded(cfg, "download", lambda tmp: prepare_dataset(cfg.data, tmp, store.root / "raw")),
                     version("download"))
