"""registry.build_repairs with a cache: each repair is built once per (name, *key), so the pipeline, the Classifier
and the benches share one spelling dictionary across sets (issue 34: one helper, not three copies)."""

from __future__ import annotations

from ttt_pipeline.defenses import registry


def test_a_cache_builds_each_repair_once_per_key():
    cache: dict = {}
    first = registry.build_repairs("dedupe", None, cache=cache)
    again = registry.build_repairs("dedupe", None, cache=cache)
    assert len(first) == 1 and first[0] is again[0]
    other = registry.build_repairs("dedupe", None, cache=cache, key=(2, True))
    assert other[0] is not first[0] and set(cache) == {("dedupe",), ("dedupe", 2, True)}
    assert registry.build_repairs("none", None, cache=cache) == []


def test_without_a_cache_every_call_builds():
    a, b = registry.build_repairs("dedupe", None), registry.build_repairs("dedupe", None)
    assert a[0] is not b[0]
    assert a[0](["good good product"]) == b[0](["good good product"])
