"""The CPU cores this process may run on: what thread counts are split from."""

from __future__ import annotations

import os


def available_cores() -> int:
    """The cores of the affinity mask (a cgroup's or taskset's share), else every core the machine has."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
