"""Test workers' core shares (tests/workers.py): disjoint where there are enough cores, none left idle."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from workers import core_share


def test_two_workers_on_two_cores_get_one_each():
    assert [core_share([0, 1], k, 2) for k in range(2)] == [{0}, {1}]


def test_shares_are_disjoint_and_cover_the_cores_when_they_divide():
    shares = [core_share(list(range(16)), k, 4) for k in range(4)]
    assert [len(s) for s in shares] == [4, 4, 4, 4]
    assert set().union(*shares) == set(range(16))


def test_more_workers_than_cores_share_them_in_turn():
    assert [core_share([3, 5], k, 3) for k in range(3)] == [{3}, {5}, {3}]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2,
                    reason="needs sched_setaffinity and two cores")
def test_a_pinned_worker_and_its_children_see_one_core_and_torch_sizes_to_it():
    """The library's set_threads, in a process the worker starts, gives torch the worker's one core (the process
    first takes all cores, as a worker starts, even when this test runs inside a pinned worker itself)."""
    code = ("import os, sys; os.sched_setaffinity(0, range(os.cpu_count())); "
            "sys.path.insert(0, 'tests'); from workers import pin_xdist_worker; pin_xdist_worker(); "
            "import subprocess; print(len(os.sched_getaffinity(0))); "
            "print(subprocess.run([sys.executable, '-c', 'from ttt_pipeline.modeling.train import set_threads; "
            "print(set_threads())'], capture_output=True, text=True).stdout.strip())")
    env = {**os.environ, "TTT_TEST_PIN_WORKERS": "1", "PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=Path(__file__).resolve().parent.parent,
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1", "1"], out.stderr[-2000:]
