"""Process-wide settings of torch's CPU backends that the library needs before its first tensor operation.

oneDNN runs torch's bf16 matrix maths on a CPU and keeps the last 1024 primitives it built, one per shape, each
holding its own buffers. Length-grouped batches and dynamic padding make a new shape nearly every step, so that
cache only grows: the demo's fine-tuning left 300 MB allocated after every tensor was freed, and each masked-TTT
method 100 MB more (measured 2026-11-28). 16 primitives lowered the demo's peak by 274 MB with the same figures,
fine-tuning 3% slower and evaluate no slower (the rule and runs: docs/results.md). oneDNN reads the capacity once,
when it builds its first primitive, so `ttt_pipeline.modeling` sets it when it is imported: before any model of
this library runs, whichever entry point (CLI, Prefect worker, MLflow pyfunc, benches, a user's script) loads it.
"""

from __future__ import annotations

import os

# oneDNN's primitive cache, in primitives (its default: 1024); chosen by the rule in docs/results.md (2026-11-28)
PRIMITIVE_CACHE = 16
# oneDNN reads ONEDNN_PRIMITIVE_CACHE_CAPACITY, else its older name DNNL_PRIMITIVE_CACHE_CAPACITY
_CACHE_VARS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY")


def cap_primitive_cache(capacity: int = PRIMITIVE_CACHE) -> None:
    """Keep oneDNN's primitive cache to `capacity` unless the environment sets it under either name. Too late
    once the process has built a oneDNN primitive (a bf16 op ran before this library was imported)."""
    if not any(os.environ.get(name) for name in _CACHE_VARS):
        os.environ[_CACHE_VARS[0]] = str(capacity)
