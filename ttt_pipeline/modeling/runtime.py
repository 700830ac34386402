"""Process-wide settings of torch's CPU backends that the library needs before its first tensor operation.

torch runs bf16 matrix maths on a CPU through oneDNN, and through ideep, its layer over oneDNN. Each keeps a cache
of what it built, one entry per shape, each entry holding its own buffers: oneDNN the last 1024 primitives
(`ONEDNN_PRIMITIVE_CACHE_CAPACITY`), ideep the last 1024 computations per thread on x86 (`LRU_CACHE_CAPACITY`; 1 on
Arm, left as it is there). Length-grouped
batches and dynamic padding (and the masked-token count of each MLM step) make a new shape nearly every step, so
both caches only grow:
- oneDNN's: the demo's fine-tuning left about 300 MB allocated after every tensor was freed, and each masked-TTT
  method about 100 MB more; with 16 primitives the demo's peak is lower, fine-tuning about 3% slower;
- ideep's: fine-tuning kept about 10 MB more in use per demo epoch, with no end; with 16 the demo's peak is lower
  and no slower.
The figures are in docs/benchmarks.md (Memory). Both libraries read their capacity when they first build something, so
`ttt_pipeline.modeling` sets both when it is imported: before any model of this library runs, whichever entry
point (CLI, Prefect worker, MLflow pyfunc, benches, a user's script) loads it.
"""

from __future__ import annotations

import os
import platform
import re

from ttt_pipeline.errors import ConfigError

# entries per cache, oneDNN's and ideep's (both default to 1024); the capacity whose demo peak was lowest without
# slowing fine-tuning by more than 5% (docs/benchmarks.md, Memory)
PRIMITIVE_CACHE = 16
# oneDNN reads ONEDNN_PRIMITIVE_CACHE_CAPACITY, else its older name DNNL_PRIMITIVE_CACHE_CAPACITY
_CACHE_VARS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY")
_IDEEP_VAR = "LRU_CACHE_CAPACITY"  # ideep's name (torch's CPU tuning notes: a fix for growth on dynamic shapes)
IDEEP_CAPPED = platform.machine().lower() in ("x86_64", "amd64")  # ideep's default is 1024 on x86, 1 on Arm
_WHOLE = re.compile(r"[0-9]+")  # ASCII digits: str.isdigit also takes "²", which int() refuses


def cap_primitive_cache(capacity: int = PRIMITIVE_CACHE) -> None:
    """Keep oneDNN's primitive cache and, on x86, ideep's computation caches to `capacity` entries each, unless
    the environment sets them (oneDNN's under either name). oneDNN reads its value once per process, ideep once per
    thread, each at its first use: a bf16 op run before this library was imported keeps the default there."""
    if not any(os.environ.get(name) for name in _CACHE_VARS):
        os.environ[_CACHE_VARS[0]] = str(capacity)
    _check_ideep_capacity(os.environ.get(_IDEEP_VAR))
    if IDEEP_CAPPED and not os.environ.get(_IDEEP_VAR):
        os.environ[_IDEEP_VAR] = str(capacity)


def _check_ideep_capacity(value: str | None) -> None:
    """A user's LRU_CACHE_CAPACITY must be a whole number >= 1: ideep reads it with atoi, and 0 or text (atoi: 0) end
    the process with a segmentation fault at its first bf16 operation, no message (torch 2.13 on an AVX512 x86 CPU:
    `LRU_CACHE_CAPACITY=0` and `=abc` exit 139 on one bf16 linear layer). A negative number does not crash there,
    and is refused too: it is no capacity."""
    if value and not (_WHOLE.fullmatch(value.strip()) and int(value) >= 1):
        raise ConfigError(f"LRU_CACHE_CAPACITY={value!r} in the environment: ideep (torch's bf16 layer over oneDNN) "
                          "needs a whole number >= 1 (with 0 or text it crashes the process at its first bf16 "
                          "operation)", f"unset LRU_CACHE_CAPACITY (this library keeps {PRIMITIVE_CACHE} entries) or "
                          f"set a whole number >= 1, e.g. LRU_CACHE_CAPACITY={PRIMITIVE_CACHE}")
