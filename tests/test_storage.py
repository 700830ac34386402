"""Step outputs appear atomically, are reused only when their digest verifies, and have one writer."""

from __future__ import annotations

import json
import threading
import time

from ttt_pipeline.storage import StepStore, atomic_dir, stable_hash


def test_stable_hash_ignores_key_order():
    assert stable_hash({"a": 1, "b": [1, 2]}) == stable_hash({"b": [1, 2], "a": 1})
    assert stable_hash({"a": 1}) != stable_hash({"a": 2})


def test_second_run_is_served_from_store(tmp_path):
    calls = []

    def build(tmp):
        calls.append(1)
        (tmp / "out.txt").write_text("hello")
        return {"n": 1}

    store = StepStore(tmp_path)
    a = store.run("s", {"x": 1}, build)
    b = store.run("s", {"x": 1}, build)
    assert calls == [1] and not a.cached and b.cached and a.digest == b.digest and b.meta == {"n": 1}
    c = store.run("s", {"x": 2}, build)
    assert len(calls) == 2 and c.key != a.key


def test_damaged_entry_is_rebuilt_not_used(tmp_path):
    store = StepStore(tmp_path)
    a = store.run("s", {}, lambda tmp: (tmp / "f").write_text("good") and {})
    (tmp_path / "s" / a.key / "f").write_text("bitrot")
    b = store.run("s", {}, lambda tmp: (tmp / "f").write_text("good") and {})
    assert not b.cached and (tmp_path / "s" / a.key / "f").read_text() == "good"


def test_interrupted_build_leaves_no_entry(tmp_path):
    store = StepStore(tmp_path)

    def crash(tmp):
        (tmp / "half").write_text("partial")
        raise RuntimeError("killed")

    try:
        store.run("s", {}, crash)
    except RuntimeError:
        pass
    assert store.load("s", StepStore.key("s", {})) is None
    assert not [p for p in (tmp_path / "s").iterdir() if p.is_dir()]


def test_concurrent_runs_build_once(tmp_path):
    calls = []

    def slow(tmp):
        calls.append(1)
        time.sleep(0.5)
        (tmp / "f").write_text("x")
        return {}

    outs = []
    threads = [threading.Thread(target=lambda: outs.append(StepStore(tmp_path).run("s", {}, slow))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1] and len({o.digest for o in outs}) == 1


def test_atomic_dir_replaces_whole(tmp_path):
    final = tmp_path / "d"
    with atomic_dir(final) as tmp:
        (tmp / "a").write_text("1")
    with atomic_dir(final) as tmp:
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in final.iterdir()) == ["b"]
    assert json.dumps(sorted(p.name for p in tmp_path.iterdir())) == '["d"]'
