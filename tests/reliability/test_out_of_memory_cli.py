"""Out of memory in a stage ends `ttt-pipeline run` with `error:` naming the stage and a `hint:` naming the
settings that lower memory: never a traceback (measured before: masked TTT's adaptation step died under
`ulimit -v 4000000` with torch's `DefaultCPUAllocator: can't allocate memory` and a Prefect traceback)."""

from __future__ import annotations

import sys

import pytest
from reliability_helpers import run_cli
from tiny_config import tiny_config

from ttt_pipeline import steps
from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.modeling.oom import OutOfMemory, is_out_of_memory, memory_errors
from ttt_pipeline.storage import StepStore

ALLOCATOR = "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to " \
            "allocate 91226112 bytes. Error code 12 (Cannot allocate memory)"
# Loaded by the CLI's interpreter: the first masked TTT step fails as torch's CPU allocator does.
FAULT = f"""
import ttt_pipeline.defenses.base as base
def _fail(*a, **k):
    raise RuntimeError({ALLOCATOR!r})
base.EpisodicEngine.predict = _fail
"""


def test_memory_errors_are_recognised_and_others_pass_through():
    assert is_out_of_memory(RuntimeError(ALLOCATOR)) and is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("shape mismatch")) and not is_out_of_memory(ValueError("memory"))
    with pytest.raises(OutOfMemory, match=r"out of memory in evaluate \(\[enforce fail") as err:
        with memory_errors("evaluate", "lower ttt.batch_size"):
            raise RuntimeError(ALLOCATOR)
    assert err.value.hint == "lower ttt.batch_size"
    with pytest.raises(RuntimeError, match="shape mismatch"):
        with memory_errors("evaluate", "x"):
            raise RuntimeError("shape mismatch")


def test_onednn_primitive_failure_is_out_of_memory_only_under_a_memory_limit(monkeypatch):
    import resource

    primitive = RuntimeError("could not create a primitive")
    unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    monkeypatch.setattr(resource, "getrlimit", lambda r: unlimited)
    assert not is_out_of_memory(primitive)
    monkeypatch.setattr(resource, "getrlimit",
                        lambda r: (4_096_000_000, resource.RLIM_INFINITY) if r == resource.RLIMIT_AS else unlimited)
    assert is_out_of_memory(primitive) and not is_out_of_memory(RuntimeError("shape mismatch"))
    with pytest.raises(OutOfMemory, match=r"out of memory in evaluate \(could not create a primitive\)"):
        with memory_errors("evaluate", "lower ttt.batch_size"):
            raise primitive


def test_a_step_names_itself_and_its_settings(tmp_path, tiny_bert_dir, monkeypatch):
    cfg = PipelineConfig.model_validate(tiny_config(tmp_path, tiny_bert_dir, suite="reliability"))
    store = StepStore(cfg.store)
    data = steps.download(cfg, store)

    def no_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr("ttt_pipeline.modeling.tokenize.tokenize_dataset", no_memory)
    with pytest.raises(OutOfMemory, match=r"out of memory in tokenise \(MemoryError\)") as err:
        steps.tokenise(cfg, data, store)
    assert "model.max_length (now 48)" in err.value.hint
    assert steps.stored("tokenise", steps.tokenise_inputs(cfg, data), store) is None  # nothing half-written


@pytest.mark.slow
def test_out_of_memory_in_masked_ttt_ends_the_run_with_error_and_hint(tmp_path, tiny_bert_dir):
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "fault.py").write_text(FAULT)  # run by the probe's sitecustomize in the CLI's process
    run = run_cli(tmp_path, tiny_config(tmp_path, tiny_bert_dir, suite="reliability", finetune={"epochs": 1}),
                  timeout=600)
    assert run.returncode == 2, run.stderr[-3000:]
    error, hint = run.stderr.strip().splitlines()[-2:]  # after the stage lines: the error and its fix, no more
    assert error.startswith("error: out of memory in evaluate ([enforce fail at alloc_cpu.cpp"), error
    assert hint.startswith("hint: lower ttt.batch_size (now 8)") and "ttt.params=layernorm" in hint, hint
    assert "Traceback" not in run.stderr + run.stdout and "Finished in state Failed" not in run.stderr
    assert "evaluate: started" in run.stderr  # the stages before it ran and are kept


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap: Linux only")
def test_freed_blocks_between_live_ones_go_back_to_the_system():
    """What fine-tuning's activations of many sizes leave: freed blocks that glibc keeps between live ones."""
    import torch

    from ttt_pipeline.modeling.oom import release_freed_memory

    torch.empty(4 * 2**20).fill_(1.0)  # freeing a 16 MB block (under 32 MB) raises glibc's mmap threshold past 1 MB
    blocks = [torch.ones(2**18) for _ in range(300)]  # 300 x 1 MB, touched
    del blocks[::2]  # 150 MB freed in holes between live blocks: no free top for glibc to shrink by itself
    before = _rss_mb()
    release_freed_memory()
    assert before - _rss_mb() >= 100, (before, _rss_mb())
    assert all(float(b[0]) == 1.0 for b in blocks)  # the live ones are untouched


def test_every_stage_releases_its_freed_memory_when_it_ends(monkeypatch):
    from ttt_pipeline.modeling import oom

    calls = []
    monkeypatch.setattr(oom, "release_freed_memory", lambda: calls.append(1))
    with memory_errors("evaluate", "x"):
        pass
    with pytest.raises(RuntimeError, match="shape mismatch"), memory_errors("evaluate", "x"):
        raise RuntimeError("shape mismatch")
    with pytest.raises(OutOfMemory), memory_errors("evaluate", "x"):
        raise MemoryError()
    assert len(calls) == 3


ARROW_PROBE = """
import contextlib, io, os
from ttt_pipeline.cli import main as cli
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    cli.main(["--help"])
import pyarrow, pyarrow._dataset  # what `datasets` loads; mimalloc's pool reserves its 1 GiB here
spans = [[int(x, 16) for x in line.split()[0].split("-")] for line in open("/proc/self/maps")]
big = [(a, b) for a, b in spans if b - a >= 2**30]
print(os.environ["ARROW_DEFAULT_MEMORY_POOL"], pyarrow.default_memory_pool().backend_name, len(big))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_the_cli_takes_the_system_arrow_pool_without_its_address_space_reservation():
    """`ttt-pipeline` sets ARROW_DEFAULT_MEMORY_POOL=system before pyarrow loads (a user's value wins): mimalloc's
    pool reserves 1 GiB of address space, which made the demo run out under `ulimit -v 4000000`."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run([sys.executable, "-c", ARROW_PROBE], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["system", "system", "0"], out.stdout
    out = subprocess.run([sys.executable, "-c", ARROW_PROBE], env={**env, "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.split()[:2] == ["mimalloc", "mimalloc"], out.stdout  # its reservation: a build detail
