"""Seeded, stratified splits and caps: every class keeps its share, and the same seed gives the same rows. A grouped
split (data.group_column) moves whole groups, so that no group (a movie, a product) is on both sides."""

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


def group_ids(groups: list, texts: list[str]) -> list[int]:
    """One group id per row: rows that share a group value are one group, and so are rows with the same text (one
    review filed under two titles would otherwise sit on both sides). A row without a group value (None) is a
    group of its own unless its text joins it to another. Ids are numbered in order of first appearance."""
    parent = list(range(len(texts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[tuple[str, str], int] = {}
    for i, (group, text) in enumerate(zip(groups, texts)):
        keys = [("text", text)] + ([("group", str(group))] if group is not None else [])
        for key in keys:
            j = first.setdefault(key, i)
            if j != i:
                parent[root(i)] = root(j)
    ids: dict[int, int] = {}
    return [ids.setdefault(root(i), len(ids)) for i in range(len(texts))]


def grouped_split(labels: list[int], groups: list[int], fraction: float, seed: int, names: list[str], what: str):
    """(keep, taken) index arrays where no group has rows on both sides. Groups are visited in a seeded order and
    each joins `taken` when it brings the per-class counts closer to round(fraction * n) (at least 1, at most n - 1
    per class): shares near the stratified split's, whole groups only."""
    labels_arr, groups_arr = np.asarray(labels), np.asarray(groups)
    classes = sorted(int(c) for c in np.unique(labels_arr))
    uniq, inverse = np.unique(groups_arr, return_inverse=True)
    counts = np.zeros((len(uniq), len(classes)), dtype=np.int64)
    np.add.at(counts, (inverse, np.searchsorted(classes, labels_arr)), 1)
    totals = counts.sum(0)
    target = np.clip(np.round(fraction * totals), 1, np.maximum(totals - 1, 1))
    taken_counts = np.zeros(len(classes), dtype=np.int64)
    chosen = np.zeros(len(uniq), dtype=bool)
    for g in np.random.default_rng(seed).permutation(len(uniq)):
        after = taken_counts + counts[g]
        if np.abs(target - after).sum() < np.abs(target - taken_counts).sum():
            taken_counts, chosen[g] = after, True
    for k, c in enumerate(classes):
        if taken_counts[k] == 0 or taken_counts[k] == totals[k]:
            n_groups = int((counts[:, k] > 0).sum())
            raise DataError(
                f"class '{names[c]}': its {int(totals[k])} review(s) lie in {n_groups} group(s) of data.group_column, "
                f"which cannot be divided to split off a {what} set with reviews of every class on both sides",
                "give more groups, set data.group_column=null to split row by row, or give a separate test set "
                "(data.test_path)")
    taken_mask = chosen[inverse]
    return np.flatnonzero(~taken_mask).tolist(), np.flatnonzero(taken_mask).tolist()
