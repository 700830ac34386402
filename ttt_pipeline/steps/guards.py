"""Out-of-memory errors of a step turned into `error: out of memory in <step>` and a hint naming the settings
that lower its memory, with their current values."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.steps.machine import runtime


def memory_hint(cfg: PipelineConfig, stage: str) -> str:
    """The settings that lower a stage's memory, with their current values."""
    length, ft, ttt = cfg.model.max_length, cfg.finetune, cfg.ttt
    fused = ft.attention_dropout == 0 and runtime(cfg).attention.name != "eager"
    attention = "" if fused else ("finetune.attention_dropout=0 with finetune.attention=sdpa keeps no attention score "
                                  "matrices; ")
    checkpointing = "" if ft.activation_checkpointing or ft.mode != "full" else (
        "finetune.activation_checkpointing=true keeps only each layer's input (the same weights, a slower step); ")
    half = min(ttt.sub_batch_tokens, 2048) // 2 if ttt.sub_batch_tokens else 2048  # null or 0: off
    # not a default: it lowers the demo's peak but slows fine-tuning (docs/benchmarks.md, memory)
    heap = "; with glibc, MALLOC_MMAP_THRESHOLD_=4194304 in the environment returns freed activations to the " \
           "system (slower steps)" if sys.platform.startswith("linux") else ""
    sub_batches = f"ttt.sub_batch_tokens={half} adapts in smaller sub-batches (the same loss and step, up to " \
                  "rounding); " if half else ""
    return {
        "download": "lower data.max_train_samples / data.max_test_samples, or give the run more memory",
        "tokenise": f"lower model.max_length (now {length}) or data.max_train_samples",
        "finetune": f"lower finetune.batch_size (now {ft.batch_size}) or model.max_length (now {length}); "
                     f"{attention}{checkpointing}finetune.precision=bf16 halves activations (fast on CUDA and on CPUs "
                     f"with native bf16){heap}",
        "corrupt": "lower data.max_test_samples, or score fewer corruption.families / corruption.severities",
        "evaluate": f"lower ttt.batch_size (now {ttt.batch_size}) or model.max_length (now {length}); "
                    f"{sub_batches}ttt.params=layernorm adapts and copies far fewer weights than "
                    f"ttt.params={ttt.params}{heap}",
        "import-model": "give the run more memory: the whole model is loaded once, in fp32",
        "attribute": f"lower attribution.batch_size (now {cfg.attribution.batch_size}), attribution.proj_dim "
                     f"(now {cfg.attribution.proj_dim}) or attribution.max_train",
    }[stage]


def guarded(cfg: PipelineConfig, stage: str, build: Callable[[Path], dict]) -> Callable[[Path], dict]:
    """`build` with out-of-memory errors turned into `error: out of memory in <stage>` plus a hint."""
    from ttt_pipeline.modeling.oom import memory_errors

    def run(tmp: Path) -> dict:
        with memory_errors(stage, memory_hint(cfg, stage)):
            return build(tmp)

    return run
