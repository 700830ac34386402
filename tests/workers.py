"""Test workers on their own cores: pytest-xdist runs test files side by side (make test, make test-slow)."""

from __future__ import annotations

import os


def core_share(cores: list[int], worker: int, workers: int) -> set[int]:
    """Worker k of n keeps the k-th n-th of the cores, at least one (more workers than cores: they share, in turn)."""
    share = max(1, len(cores) // workers)
    start = (worker * share) % len(cores)
    return set(cores[start:start + share])


def pin_xdist_worker() -> None:
    """Under pytest-xdist with TTT_TEST_PIN_WORKERS=1, this worker and every process it starts keep its core_share:
    the library's set_threads then sizes torch to that share instead of giving every worker all cores, which
    oversubscribed them (the slow tier on two unpinned workers ran the demo fixture 2.3x slower than alone)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if os.environ.get("TTT_TEST_PIN_WORKERS") != "1" or not worker.startswith("gw") or not hasattr(os, "sched_setaffinity"):
        return
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.sched_setaffinity(0, core_share(sorted(os.sched_getaffinity(0)), int(worker[2:]), workers))
