"""What the store holds for a configuration, so that a stopped run can say what the same command resumes from."""

from __future__ import annotations

import json
from pathlib import Path

from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.steps.keys import (
    corrupt_inputs,
    download_inputs,
    evaluate_inputs,
    finetune_inputs,
    stored,
    tokenise_inputs,
    version,
)
from ttt_pipeline.storage import StepStore


def kept(cfg: PipelineConfig, store: StepStore) -> list[str]:
    """What the store holds for this config, in pipeline order: each finished step, and an interrupted
    finetune step's last checkpoint, so that a stopped run can say what the same command will resume from."""
    data = stored("download", download_inputs(cfg), store)
    if data is None:
        return []
    out = ["download"]
    tokens = stored("tokenise", tokenise_inputs(cfg, data), store)
    model = None
    if tokens is not None:
        out.append("tokenise")
        inputs = finetune_inputs(cfg, tokens, data)
        model = stored("finetune", inputs, store)
        epochs = _checkpoint_epochs(store.root / "finetune" / f"{StepStore.key('finetune', inputs, version('finetune'))}"
                                    ".work")
        if model is not None:
            out.append("finetune")
        elif epochs:
            out.append(f"finetune's checkpoint after epoch {epochs} of {cfg.finetune.epochs}")
    corrupted = stored("corrupt", corrupt_inputs(cfg, data), store)
    if corrupted is not None:
        out.append("corrupt")
        if model is not None and stored("evaluate", evaluate_inputs(cfg, data, model, corrupted), store):
            out.append("evaluate")
    return out


def _checkpoint_epochs(work: Path) -> int:
    try:
        return len(json.loads((work / "state.json").read_text())["history"]) if (work / "last.pt").is_file() else 0
    except (OSError, ValueError, KeyError):
        return 0
