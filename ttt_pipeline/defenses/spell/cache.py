"""The bound on `spell`'s per-instance caches: each is cleared when full, so memory stays bounded on any input."""

from __future__ import annotations

_CACHE_LIMIT = 500_000  # entries of each per-instance cache


def _remember(cache: dict, key, value):
    """cache[key] = value, the cache cleared first when it holds _CACHE_LIMIT entries; returns value."""
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value
