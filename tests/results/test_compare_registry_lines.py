"""`ttt-pipeline compare`'s registry lines: each run under its own registered model's name."""

from __future__ import annotations

from ttt_pipeline.io.runs import format_compare


def summary(run_id: str, registry: dict) -> dict:
    return {"run_id": run_id, "run_name": run_id, "registry": registry, "metrics": {}, "params": {}}


def lines(a: dict, b: dict) -> list[str]:
    text = format_compare({"a": a, "b": b, "metrics": {}, "params_differing": {}})
    return [ln for ln in text.splitlines() if ln.startswith("registry:")]


def test_two_champions_of_two_names_are_each_said_with_their_own_name():
    a = summary("a" * 32, {"model_name": "ttt-demo-reviews-negative-positive-my-model", "version": "1",
                           "is_champion": True})
    b = summary("b" * 32, {"model_name": "ttt-demo-reviews-negative-positive-my-classifier", "version": "1",
                           "is_champion": True})
    assert lines(a, b) == [
        "registry: A holds the `champion` alias of ttt-demo-reviews-negative-positive-my-model (v1)",
        "registry: B holds the `champion` alias of ttt-demo-reviews-negative-positive-my-classifier (v1)"]


def test_a_run_that_lost_or_registered_nothing_is_said_so():
    a = summary("a" * 32, {"model_name": "tiny", "version": "2", "is_champion": False})
    b = summary("b" * 32, {"model_name": "tiny", "decision": "skipped"})
    assert lines(a, b) == ["registry: A is tiny v2, not its `champion`", "registry: B registered no model version"]
    assert lines(summary("a" * 32, {}), summary("b" * 32, {})) == []
