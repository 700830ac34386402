"""oneDNN's primitive cache and ideep's computation cache are kept small in any process that imports the library's
models: with their defaults (1024 entries each, one per shape) a bf16 layer run on many sequence lengths keeps
hundreds of MB after its tensors are gone (the demo's fine-tuning left about 300 MB allocated, each masked-TTT
method about 100 MB more, and longer fine-tuning kept about 10 MB more per epoch, with no end)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from reliability_helpers import assert_plain_error, has_mallinfo2, heap_probe_env, run_cli
from tiny_config import tiny_config

from ttt_pipeline.errors import ConfigError
from ttt_pipeline.modeling import precision, runtime

VARS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def _child(code: str, **env: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter whose environment sets no cache variable, then `env`."""
    out = subprocess.run([sys.executable, "-c", code], env=heap_probe_env(VARS, **env), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


CAP = str(runtime.PRIMITIVE_CACHE)
IDEEP = CAP if runtime.IDEEP_CAPPED else None  # ideep's default elsewhere (Arm: 1) is left alone


@pytest.mark.parametrize(("env", "seen"), [
    ({}, (CAP, None, IDEEP)),
    ({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "512"}, ("512", None, IDEEP)),
    ({"DNNL_PRIMITIVE_CACHE_CAPACITY": "512"}, (None, "512", IDEEP)),  # oneDNN's older name wins over our default too
    ({"LRU_CACHE_CAPACITY": "512"}, (CAP, None, "512")),
])
def test_importing_the_models_caps_the_caches_unless_the_environment_sets_them(env, seen):
    out = _child("import os, ttt_pipeline.modeling; "
                 f"print(*[os.environ.get(v, 'unset') for v in {VARS!r}])", **env)
    assert out.stdout.split() == [s or "unset" for s in seen]


# A bf16 linear layer's forward and backward on 64 sequence lengths, then what stays allocated (glibc's mallinfo2)
# once every tensor is gone; `cap` imports the library's models first, as every entry point does.
PROBE = textwrap.dedent("""
    import ctypes, sys
    class MI2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
    libc = ctypes.CDLL("libc.so.6"); libc.mallinfo2.restype = MI2
    def allocated():
        m = libc.mallinfo2(); return m.uordblks + m.hblkhd
    if sys.argv[1] == "cap":
        import ttt_pipeline.modeling
    import torch
    torch.manual_seed(0); torch.set_num_threads(1)
    layer = torch.nn.Linear(384, 1536)
    before = allocated()
    for length in range(8, 72):
        x = torch.randn(8, length, 384, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(x)
        y.float().sum().backward()
        del x, y
    layer.weight.grad = layer.bias.grad = None
    print(allocated() - before)
""")


@pytest.mark.skipif(not has_mallinfo2(), reason="glibc's mallinfo2 (glibc >= 2.33) measures the heap")
@pytest.mark.skipif(not runtime.IDEEP_CAPPED, reason="ideep's cache is capped on x86 only (its default elsewhere: 1)")
@pytest.mark.skipif(not precision._probe()[0], reason="bf16 is emulated on this CPU: slow, and auto trains in fp32 there")
def test_the_cap_frees_what_a_bf16_layer_leaves_on_many_lengths():
    kept = {mode: int(_child(PROBE.replace("sys.argv[1]", repr(mode))).stdout.split()[-1]) / 2**20
            for mode in ("default", "cap")}
    # measured (AVX512 EPYC): about 106 MB with the defaults, 55 MB with oneDNN's cap alone, 9 MB with both caps
    assert kept["default"] - kept["cap"] > 60 and kept["cap"] < 0.25 * kept["default"], kept


@pytest.mark.parametrize("value", ["0", "abc", " ", "-3", "²"])  # the first three crash ideep; -3 is no capacity
def test_a_value_that_is_not_a_whole_number_from_1_is_refused_with_the_fix(monkeypatch, value):
    # measured: LRU_CACHE_CAPACITY=0 ended the demo with a segmentation fault 42 s in, at fine-tuning's first step
    monkeypatch.setenv("LRU_CACHE_CAPACITY", value)
    with pytest.raises(ConfigError) as err:
        runtime.cap_primitive_cache()
    assert "LRU_CACHE_CAPACITY" in err.value.message and f"LRU_CACHE_CAPACITY={CAP}" in err.value.hint


@pytest.mark.parametrize("value", ["1", "512", " 64"])
def test_a_whole_number_is_left_as_the_user_set_it(monkeypatch, value):
    monkeypatch.setenv("LRU_CACHE_CAPACITY", value)
    runtime.cap_primitive_cache()
    assert os.environ["LRU_CACHE_CAPACITY"] == value


def test_the_cli_says_error_and_hint_before_any_step(tmp_path, tiny_bert_dir, monkeypatch):
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "0")  # the CLI's environment is this one (cli_env)
    run = run_cli(tmp_path, tiny_config(tmp_path, tiny_bert_dir, suite="reliability"), timeout=120)
    assert_plain_error(run, "error: LRU_CACHE_CAPACITY='0'", "hint: unset")
    assert not (tmp_path / ".cache").exists() and not (tmp_path / "store").exists()  # refused before the first step
    assert not run.probe["prefect"] and not run.probe["torch_trained"], run.probe
