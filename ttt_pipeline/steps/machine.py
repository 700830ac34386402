"""The run's machine choices, resolved once per configuration and handed to every step."""

from __future__ import annotations

import functools

from ttt_pipeline.config import PipelineConfig


def runtime(cfg: PipelineConfig):
    """The run's machine choices (modeling/precision.py `Runtime`: device, fine-tuning and scoring precision,
    attention), resolved once per configuration and machine verdict in this process and handed to every step: cache
    keys, run metadata, fine-tuning and scoring all read this one object."""
    from ttt_pipeline.modeling.precision import cpu_native_bf16

    ft = cfg.finetune
    return _runtime(ft.device, ft.precision, cfg.ttt.precision, ft.attention, cpu_native_bf16())


@functools.lru_cache(maxsize=16)
def _runtime(device: str, train_precision: str, score_precision: str, attention: str, machine: tuple):
    """`machine`, the CPU's native-bf16 verdict, is part of the key: a test that stands in another CPU (its
    TTT_CPU_NATIVE_BF16) gets that CPU's choices."""
    from ttt_pipeline.modeling.model import pick_device
    from ttt_pipeline.modeling.precision import resolve_runtime

    return resolve_runtime(pick_device(device), train_precision, score_precision, attention)
