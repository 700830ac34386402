"""The out-of-memory hints of fine-tune and evaluate name glibc's `MALLOC_MMAP_THRESHOLD_`: fixed at 4 MiB it kept
the demo's peak 254 MB lower (under 2 GB) at 18% slower fine-tuning (docs/benchmarks.md, Memory), so it is the
user's choice, not a default. These tests check the hint and that the variable does what the hint says."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from reliability_helpers import has_mallinfo2, heap_probe_env

from ttt_pipeline import steps
from ttt_pipeline.config import load_config

THRESHOLD = "MALLOC_MMAP_THRESHOLD_=4194304"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the hint names glibc's variable on Linux only")
@pytest.mark.parametrize("stage", ["finetune", "evaluate"])
def test_the_memory_hints_of_the_heavy_steps_name_the_threshold(stage):
    assert THRESHOLD in steps.memory_hint(load_config("demo", []), stage)


# After a 20 MiB block is freed glibc's own threshold rises to 20 MiB, so the next 8 MiB tensor comes from the heap
# (and its hole stays there); a fixed threshold maps it on its own, returned to the system when freed.
PROBE = textwrap.dedent("""
    import ctypes
    class MI2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
    libc = ctypes.CDLL("libc.so.6"); libc.mallinfo2.restype = MI2
    import torch
    big = torch.ones(20 << 20, dtype=torch.uint8)
    del big
    before = libc.mallinfo2().hblks
    small = torch.ones(8 << 20, dtype=torch.uint8)
    print(libc.mallinfo2().hblks - before)
""")


def _mapped_blocks(**env: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE], env=heap_probe_env(**env), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not has_mallinfo2(), reason="glibc (2.33 or later, for mallinfo2) has this threshold")
def test_the_named_threshold_maps_large_tensors_on_their_own():
    name, value = THRESHOLD.split("=")
    assert _mapped_blocks() == 0
    assert _mapped_blocks(**{name: value}) == 1
