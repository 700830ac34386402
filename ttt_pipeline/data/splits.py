"""Seeded, stratified splits and caps: every class keeps its share, and the same seed gives the same rows."""

from __future__ import annotations

import numpy as np

from ttt_pipeline.errors import DataError


def _by_class(labels: list[int]) -> dict[int, np.ndarray]:
    arr = np.asarray(labels)
    return {int(c): np.flatnonzero(arr == c) for c in np.unique(arr)}


def stratified_split(labels: list[int], fraction: float, seed: int, names: list[str], what: str):
    """(keep, taken) index arrays; each class gives round(fraction * n) rows, at least 1, to `taken`."""
    rng = np.random.default_rng(seed)
    keep, taken = [], []
    for c, idx in sorted(_by_class(labels).items()):
        if len(idx) < 2:
            raise DataError(
                f"class '{names[c]}' has {len(idx)} review(s): too few to split off a {what} set",
                "add reviews of that class, drop it, or give a separate test set (data.test_path)")
        idx = rng.permutation(idx)
        k = min(len(idx) - 1, max(1, int(round(fraction * len(idx)))))
        taken.extend(idx[:k].tolist())
        keep.extend(idx[k:].tolist())
    return sorted(keep), sorted(taken)


def stratified_cap(labels: list[int], n: int | None, seed: int) -> list[int]:
    """At most n row indices, classes in proportion (seeded); all rows when n is None or larger."""
    if n is None or n >= len(labels):
        return list(range(len(labels)))
    rng = np.random.default_rng(seed)
    groups = {c: rng.permutation(idx) for c, idx in sorted(_by_class(labels).items())}
    total = len(labels)
    quota = {c: max(1, int(np.floor(n * len(idx) / total))) for c, idx in groups.items()}
    while sum(quota.values()) > n:  # more classes than n: drop from the largest quotas
        c = max(quota, key=quota.get)
        quota[c] -= 1
    order = sorted(groups, key=lambda c: -len(groups[c]))
    i = 0
    while sum(quota.values()) < n:  # distribute the remainder, largest classes first
        c = order[i % len(order)]
        if quota[c] < len(groups[c]):
            quota[c] += 1
        i += 1
    return sorted(int(x) for c, idx in groups.items() for x in idx[:quota[c]])
