"""What every task shares: the step output as a dict, the configured store and the cache key of a stored step."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable

from ttt_pipeline import steps
from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.storage import StepOutput, StepStore


def _out(d: dict | StepOutput) -> StepOutput:
    return d if isinstance(d, StepOutput) else StepOutput(**d)


def _store(cfg: PipelineConfig) -> StepStore:
    """A folder, or an fsspec URL synced through a local working cache (ttt_pipeline.io.remote_store)."""
    from ttt_pipeline.io.remote_store import open_store

    return open_store(cfg.store)


def step_cache(step: str, inputs_of: Callable[[dict[str, Any]], dict]):
    def key_fn(context, parameters: dict[str, Any]) -> str | None:
        cfg = parameters["cfg"]
        hit = steps.stored(step, inputs_of(parameters), _store(cfg))
        if hit is None:
            return None
        # the entry's own path is part of the key: Prefect's result storage (~/.prefect/storage) is shared by
        # every store on this machine, and a record made for another store would hand back *its* path
        where = hashlib.sha256(str(Path(hit.path).resolve()).encode()).hexdigest()[:12]
        return f"{step}-{hit.key}-{hit.digest[:16]}-{where}"

    return key_fn


COMMON = dict(persist_result=True, result_serializer="json")
