"""`precision: auto` fits the machine: bf16 only where the CPU runs it natively, fp32 elsewhere, and the cache
key, the run metadata and the logs carry what it resolved to."""

from __future__ import annotations

import logging

import pytest
import torch

from ttt_pipeline.errors import ConfigError
from ttt_pipeline.modeling import precision


def _cpu(monkeypatch, native: bool) -> None:
    monkeypatch.setenv(precision.ENV_OVERRIDE, "1" if native else "0")


@pytest.mark.parametrize("native, name, dtype", [(True, "bf16", torch.bfloat16), (False, "fp32", None)])
def test_auto_on_a_cpu_follows_native_bf16(monkeypatch, native, name, dtype):
    _cpu(monkeypatch, native)
    chosen = precision.resolve_precision("cpu", "auto")
    assert (chosen.name, chosen.dtype) == (name, dtype)
    assert chosen.reason.startswith("auto: ") and ("native bf16" in chosen.reason)


def test_explicit_bf16_on_an_emulating_cpu_is_honoured_with_a_warning(monkeypatch, caplog):
    _cpu(monkeypatch, False)
    with caplog.at_level(logging.WARNING, logger=precision.__name__):
        chosen = precision.resolve_precision("cpu", "bf16", "finetune.precision")
    assert chosen.name == "bf16"
    assert "emulated" in caplog.text and "finetune.precision=auto" in caplog.text
    _cpu(monkeypatch, True)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=precision.__name__):
        assert precision.resolve_precision("cpu", "fp32").dtype is None
    assert caplog.text == ""


def test_the_override_is_validated_and_unset_asks_the_cpu(monkeypatch):
    monkeypatch.setenv(precision.ENV_OVERRIDE, "yes")
    with pytest.raises(ConfigError, match="TTT_CPU_NATIVE_BF16='yes' is neither 0 nor 1"):
        precision.resolve_precision("cpu", "auto")
    monkeypatch.delenv(precision.ENV_OVERRIDE)
    assert precision.cpu_native_bf16() == precision._probe()


def test_fp16_and_unknown_names_fail_at_the_edge_naming_the_field():
    with pytest.raises(ConfigError, match="ttt.precision=fp16 needs a CUDA device"):
        precision.resolve_precision("cpu", "fp16", "ttt.precision")
    with pytest.raises(ConfigError, match="is not a precision"):
        precision.resolve_precision("cpu", "half")


def test_the_real_probe_agrees_with_the_cpu_flags():
    """The unpatched probe: torch's feature checks and /proc/cpuinfo tell the same story on this machine (unless
    oneDNN is capped below bf16 here)."""
    native, evidence = precision._probe()
    flags = precision._cpu_flags()
    if flags:
        expected = bool(flags & {"avx512_bf16", "amx_bf16", "bf16"}) and precision._onednn_cap() is None
        assert native == expected, evidence
    summary = precision.machine_summary()
    assert summary["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert summary["threads"] >= 1 and summary["torch"] == torch.__version__


@pytest.mark.parametrize("native, key", [(True, "bf16"), (False, "fp32")])
def test_cache_keys_carry_the_resolved_precision(monkeypatch, native, key):
    """A bf16 machine and an AVX2 machine never share a cached model or evaluation; `auto` and its resolved
    value share one (a preset that said bf16 before keeps its cache on a bf16 machine)."""
    from ttt_pipeline import steps
    from ttt_pipeline.config import PipelineConfig
    from ttt_pipeline.storage import StepOutput

    _cpu(monkeypatch, native)
    up = StepOutput(step="x", key="k", path="x", digest="d", cached=True, meta={"sets": {}})
    cfg = PipelineConfig().model_copy(deep=True)
    cfg.finetune.device = "cpu"
    assert steps.finetune_inputs(cfg, up, up)["finetune"]["precision"] == key
    assert steps.evaluate_inputs(cfg, up, up, up)["ttt"]["precision"] == key
    forced = cfg.model_copy(deep=True)
    forced.finetune.precision = key
    assert steps.finetune_inputs(forced, up, up) == steps.finetune_inputs(cfg, up, up)


def test_attention_auto_is_eager_under_bf16_on_a_cpu_and_the_checkpoints_own_elsewhere():
    """finetune.attention: auto picks eager only where the fused attention's backward is the slow part (bf16 on a
    CPU); explicit values are honoured; an unknown one fails naming the field."""
    assert precision.resolve_attention("cpu", "bf16").name == "eager"
    assert precision.resolve_attention("cpu", "fp32").name is None
    assert precision.resolve_attention("cuda", "bf16").name is None
    assert precision.resolve_attention("cpu", "fp32", "eager").name == "eager"
    assert precision.resolve_attention("cpu", "bf16", "sdpa").name == "sdpa"
    assert "bf16 on a CPU" in precision.resolve_attention("cpu", "bf16").reason
    with pytest.raises(ConfigError, match="finetune.attention='flash'"):
        precision.resolve_attention("cpu", "bf16", "flash")


@pytest.mark.parametrize("native, key", [(True, "eager"), (False, None)])
def test_cache_keys_carry_the_attention_only_where_it_changes(monkeypatch, native, key):
    """A CPU without native bf16 keeps the keys it had before finetune.attention existed (no `attention` entry);
    a bf16 CPU keys the eager attention it trains with; an explicit value is keyed as given."""
    from ttt_pipeline import steps
    from ttt_pipeline.config import PipelineConfig
    from ttt_pipeline.storage import StepOutput

    _cpu(monkeypatch, native)
    up = StepOutput(step="x", key="k", path="x", digest="d", cached=True, meta={"sets": {}})
    cfg = PipelineConfig().model_copy(deep=True)
    cfg.finetune.device = "cpu"
    assert steps.finetune_inputs(cfg, up, up)["finetune"].get("attention") == key
    cfg.finetune.attention = "sdpa"
    assert steps.finetune_inputs(cfg, up, up)["finetune"]["attention"] == "sdpa"


@pytest.mark.parametrize("name", ["ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"])
def test_a_onednn_cap_below_bf16_means_emulated_bf16_whatever_the_cpu(monkeypatch, name):
    """oneDNN capped at AVX2 emulates bf16 even on an AVX512-BF16 CPU (1.7 s against fp32's 0.047 s for one layer
    there), so `auto` must pick fp32; a cap that keeps bf16, or none, leaves the CPU's own answer."""
    for var in precision._ONEDNN_CAP_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv(precision.ENV_OVERRIDE, raising=False)
    precision._probe.cache_clear()
    try:
        uncapped = precision._probe()
        precision._probe.cache_clear()
        monkeypatch.setenv(name, "avx2")
        native, evidence = precision._probe()
        assert not native and f"{name}=AVX2" in evidence
        assert precision.resolve_precision("cpu", "auto").name == "fp32"
        assert precision.machine_summary()["isa_caps"][name] == "avx2"  # a capped CPU says so beside its timings
        for kept in ("AVX512_CORE_BF16", "all", "no-such-isa"):
            precision._probe.cache_clear()
            monkeypatch.setenv(name, kept)
            assert precision._probe() == uncapped
    finally:
        precision._probe.cache_clear()
