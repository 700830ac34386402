"""Which compute precision fits this machine: `auto` picks bf16 on a CPU only where the CPU runs it natively.

Why: torch autocasts bf16 on any CPU, but only AVX512-BF16 and AMX execute it in hardware. On an ordinary AVX2
CPU it is emulated: a 384x1536 linear layer's forward and backward ran 18x slower than fp32 (AMD EPYC, AVX2), so
a bf16 default made the demo's fine-tuning 10-15x slower there. Where bf16 is native it is about 1.5x faster
than fp32. So `auto` asks the CPU (torch's own feature probes, the kernel's CPU flags where torch lacks them)
and every run records what it chose and why.
"""

from __future__ import annotations

import logging
import os
import platform
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from ttt_pipeline.errors import ConfigError

log = logging.getLogger(__name__)
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# CPU flags (Linux /proc/cpuinfo) that mean bf16 matrix maths in hardware: x86 AVX512-BF16 / AMX, Arm BF16.
_NATIVE_BF16_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}
ENV_OVERRIDE = "TTT_CPU_NATIVE_BF16"
# oneDNN runs torch's CPU bf16 matrix maths and obeys a cap on the instructions it may use (ONEDNN_MAX_CPU_ISA, its
# older name DNNL_MAX_CPU_ISA). Capped at one of these documented `dnnl_cpu_isa_t` names it emulates bf16 even on a
# CPU that has it (an AVX512-BF16 EPYC: a 384x1536 linear layer's bf16 forward and backward 0.013 s; capped at AVX2
# 1.7 s; fp32 0.047 s). ALL, the bf16 and AMX caps, and names oneDNN does not know leave bf16 as the CPU has it.
_ONEDNN_CAP_VARS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
_ONEDNN_BELOW_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}


@dataclass(frozen=True)
class Precision:
    """The resolved precision: `name` is fp32, bf16 or fp16; `reason` says why, for logs and run metadata."""
    name: str
    reason: str

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype (None: plain fp32, no autocast)."""
        return DTYPES[self.name]


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        key = line.split(":", 1)[0].strip().lower()
        if key in ("flags", "features"):
            return set(line.split(":", 1)[1].split())
    return set()


def _onednn_cap() -> str | None:
    """The instruction cap set for oneDNN in this process's environment when it rules out bf16 in hardware, as
    `NAME=value`; None when unset or high enough. (oneDNN reads it once, at its first use; so does this probe.)"""
    for name in _ONEDNN_CAP_VARS:
        value = os.environ.get(name, "").strip().upper()
        if value:
            return f"{name}={value}" if value in _ONEDNN_BELOW_BF16 else None
    return None


@lru_cache(maxsize=1)
def _probe() -> tuple[bool, str]:
    """torch's probes first (private but present since 2.3: `torch.cpu._is_avx512_bf16_supported`,
    `_is_amx_tile_supported`), then the kernel's CPU flags (Arm's bf16, a torch without the probes); a oneDNN cap
    below bf16 (_onednn_cap) overrules both, since bf16 is then emulated."""
    cap = _onednn_cap()
    if cap:
        return False, f"CPU without native bf16 for oneDNN ({cap}; capability {torch.backends.cpu.get_cpu_capability()})"
    probes = {"avx512_bf16": getattr(torch.cpu, "_is_avx512_bf16_supported", None),
              "amx": getattr(torch.cpu, "_is_amx_tile_supported", None)}
    found = [name for name, probe in probes.items() if probe is not None and probe()]
    if found:
        return True, f"CPU has native bf16 ({', '.join(found)})"
    flags = _cpu_flags() & _NATIVE_BF16_FLAGS
    if flags:
        return True, f"CPU has native bf16 (flags {', '.join(sorted(flags))})"
    return False, f"CPU without native bf16 (capability {torch.backends.cpu.get_cpu_capability()})"


def cpu_native_bf16() -> tuple[bool, str]:
    """(whether this CPU runs bf16 in hardware, the evidence). `TTT_CPU_NATIVE_BF16=0|1` overrides the probe:
    for a VM whose CPU flags mislead, and for tests that must compute the same numbers on every machine."""
    forced = os.environ.get(ENV_OVERRIDE)
    if forced is None or forced == "":
        return _probe()
    if forced not in ("0", "1"):
        raise ConfigError(f"{ENV_OVERRIDE}={forced!r} is neither 0 nor 1",
                          f"unset {ENV_OVERRIDE} to ask the CPU, or set it to 1 (native bf16) or 0 (none)")
    return forced == "1", f"{'CPU with' if forced == '1' else 'CPU without'} native bf16 ({ENV_OVERRIDE}={forced})"


def resolve_precision(device: torch.device | str, precision: str = "auto", field: str = "precision") -> Precision:
    """auto: on CUDA bf16 (fp16 where bf16 is unsupported); on a CPU bf16 only with native bf16, else fp32.
    Explicit fp32/bf16 are honoured (bf16 on an emulating CPU with a warning: it is slow); fp16 needs CUDA."""
    device = torch.device(device)
    if precision not in ("auto", *DTYPES):
        raise ConfigError(f"{field}={precision!r} is not a precision", "use auto, fp32, bf16 or fp16 (CUDA only)")
    if device.type == "cuda":
        if precision != "auto":
            return Precision(precision, f"{field}={precision} (set explicitly)")
        if torch.cuda.is_bf16_supported():
            return Precision("bf16", "auto: CUDA device with bf16")
        return Precision("fp16", "auto: CUDA device without bf16")
    if precision == "fp16":
        raise ConfigError(f"{field}=fp16 needs a CUDA device", f"set {field}=auto (or bf16/fp32) on a CPU")
    native, evidence = cpu_native_bf16()
    if precision == "auto":
        return Precision("bf16" if native else "fp32", f"auto: {evidence}")
    if precision == "bf16" and not native:
        log.warning("%s=bf16 on a %s: bf16 is emulated there and runs many times slower than fp32; "
                    "set %s=auto", field, evidence, field)
    return Precision(precision, f"{field}={precision} (set explicitly; {evidence})")


@dataclass(frozen=True)
class Attention:
    """The attention implementation fine-tuning runs with: `name` eager or sdpa, None for the checkpoint's own
    (transformers' default: sdpa where the model has it); `reason` says why, for logs and run metadata; `explicit`:
    set by the user (an encoder that cannot switch is then an error, under auto it keeps its own)."""
    name: str | None
    reason: str
    explicit: bool = False


def resolve_attention(device: torch.device | str, precision: str, attention: str = "auto",
                      field: str = "finetune.attention") -> Attention:
    """auto: eager under bf16 on a CPU, else the checkpoint's own. Why: on a CPU with native bf16 (AVX512, torch
    2.13) the fused attention's bf16 backward is the slow part of a step; eager attention ran MiniLM's joint step
    at 32x128 tokens in 0.76 s instead of 0.97 s with attention dropout 0, 0.93 instead of 1.03 with 0.1, while in
    fp32 both ran alike (docs/benchmarks.md). Eager keeps the attention score matrices for the backward: more memory."""
    if attention not in ("auto", "eager", "sdpa"):
        raise ConfigError(f"{field}={attention!r} is not an attention implementation", "use auto, eager or sdpa")
    if attention != "auto":
        return Attention(attention, f"{field}={attention} (set explicitly)", explicit=True)
    if torch.device(device).type == "cpu" and precision == "bf16":
        return Attention("eager", "auto: bf16 on a CPU, where the fused attention's backward is slower")
    return Attention(None, f"auto: the checkpoint's own ({precision} on {torch.device(device).type})")


@dataclass(frozen=True)
class Runtime:
    """The machine choices of one run, decided once where the run starts (the pipeline's `steps.runtime`, a
    Classifier for its own calls) and handed to what trains and scores, which never work them out again:
    `device`; `train`, the fine-tuning precision (`finetune.precision`); `score`, the precision of every forward
    pass that scores reviews, plain or under a test-time engine (`ttt.precision`); `attention`, fine-tuning's
    attention implementation (`finetune.attention`). The thread count is not here: it is each process's own
    (a data-parallel rank takes its share of the cores, `modeling.train.set_threads`)."""
    device: torch.device
    train: Precision
    score: Precision
    attention: Attention

    def describe(self) -> str:
        """One line for the run's log."""
        attention = self.attention.name or "the checkpoint's own"
        return (f"device {self.device.type}; fine-tuning {self.train.name} ({self.train.reason}), attention "
                f"{attention} ({self.attention.reason}); scoring "
                f"{self.score.name} ({self.score.reason})")


def resolve_runtime(device: torch.device | str = "cpu", train_precision: str = "auto", score_precision: str = "auto",
                    attention: str = "auto") -> Runtime:
    """The one place the configuration's machine settings meet the machine (an impossible choice fails here, before
    any work): `device` as `modeling.model.pick_device` resolved it; the rest as the configuration names them."""
    device = torch.device(device)
    train = resolve_precision(device, train_precision, "finetune.precision")
    return Runtime(device, train, resolve_precision(device, score_precision, "ttt.precision"),
                   resolve_attention(device, train.name, attention))


def machine_summary() -> dict:
    """What a timing depends on, for benches and run metadata: CPU kind, native bf16, threads, torch, and the
    instruction caps set in the environment (`isa_caps`: a capped bf16 CPU reports AVX2 but is not an AVX2 CPU)."""
    native, evidence = cpu_native_bf16()
    caps = {name: os.environ[name] for name in ("ATEN_CPU_CAPABILITY", *_ONEDNN_CAP_VARS) if os.environ.get(name)}
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "isa_caps": caps, "native_bf16": native,
            "bf16_evidence": evidence, "processor": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
