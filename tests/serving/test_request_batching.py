"""Request batching (ttt_pipeline/batching.py, Classifier.batch_requests): calls that wait for a busy model share
its next pass, each gets exactly its own rows, keys never mix, a pass's failure reaches its callers only, and the
adapting engines are never batched."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ttt_pipeline.batching import RequestBatcher


def _scorer(log: list):
    def score(key, texts, calls):
        log.append((key, list(texts)))
        return np.array([len(t) for t in texts]), [t.upper() for t in texts], "whole"
    return score


def _wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _submit_all(batcher, calls, lock):
    """Hold the model's lock while every call is submitted from its own thread, then let the passes run."""
    results = [None] * len(calls)

    def one(i, key, texts):
        results[i] = batcher.submit(key, texts)

    with lock:
        threads = [threading.Thread(target=one, args=(i, k, t)) for i, (k, t) in enumerate(calls)]
        for th in threads:
            th.start()
        _wait_for(lambda: batcher.stats().calls == len(calls))
    for th in threads:
        th.join(10)
    return results


def test_calls_waiting_for_the_model_share_one_pass_and_get_their_own_rows():
    passes, lock = [], threading.Lock()
    batcher = RequestBatcher(_scorer(passes), lock, max_texts=64)
    calls = [("k", ["a", "bb"]), ("k", ["ccc"]), ("k", ["dddd", "e", "ff"]), ("k", ["ggggg"])]
    results = _submit_all(batcher, calls, lock)
    # the first call leads the pass and waits for the model; the others join it meanwhile
    assert len(passes) == 1 and sum(len(t) for _, t in passes) == 7
    for (_, texts), (lengths, upper, whole) in zip(calls, results):
        assert lengths.tolist() == [len(t) for t in texts] and upper == [t.upper() for t in texts]
        assert whole == "whole"
    stats = batcher.stats()
    assert stats.calls == 4 and stats.passes == len(passes) and stats.texts == 7


def test_a_pass_holds_at_most_max_texts_and_keys_never_mix():
    passes, lock = [], threading.Lock()
    batcher = RequestBatcher(_scorer(passes), lock, max_texts=3)
    calls = [("a", ["1"]), ("a", ["2"]), ("b", ["3"]), ("a", ["4"]), ("a", ["5"]), ("a", ["6", "7", "8", "9"])]
    results = _submit_all(batcher, calls, lock)
    for key, texts in passes:
        assert {k for k, ts in calls if set(ts) & set(texts)} == {key}
        assert len(texts) <= 3 or texts == ["6", "7", "8", "9"]  # a call larger than a pass has one of its own
    assert sorted(t for _, ts in passes for t in ts) == [str(i) for i in range(1, 10)]
    assert [r[1] for r in results] == [ts for _, ts in calls]  # upper() of digits: the texts themselves
    assert batcher.stats().largest == 4


def test_a_failed_pass_fails_its_callers_and_the_next_pass_runs():
    lock, seen = threading.Lock(), []

    def score(key, texts, calls):
        seen.append(list(texts))
        if "bad" in texts:
            raise RuntimeError("model fault")
        return (np.zeros(len(texts)),)

    batcher = RequestBatcher(score, lock)
    with pytest.raises(RuntimeError, match="model fault"):
        batcher.submit("k", ["bad"])
    assert batcher.submit("k", ["good", "fine"])[0].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="max_texts"):
        RequestBatcher(score, lock, max_texts=0)


def _concurrently(fn, args_list):
    out = [None] * len(args_list)
    barrier = threading.Barrier(len(args_list))

    def one(i, args):
        barrier.wait()
        out[i] = fn(*args)

    threads = [threading.Thread(target=one, args=(i, a)) for i, a in enumerate(args_list)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    return out


REVIEWS = ["great sound and battery", "terible screen, broke in a week", "ok", "would buy agian for my mom",
           "the worst purchase I made this year", "love it"]


def test_a_classifier_answers_each_thread_as_alone_and_keeps_engines_out_of_batches(make_tiny_clf):
    from ttt_pipeline.classifier import Classifier

    model, tok = make_tiny_clf(("negative", "positive"))
    clf = Classifier(model, tok, {"method": "spell", "batch_size": 4}, vocabulary={"great": 3, "screen": 2})
    calls = [[REVIEWS[i % 6], REVIEWS[(i + 2) % 6]][: 1 + i % 2] for i in range(12)]
    alone = Classifier(model, tok, {"method": "spell", "batch_size": 4},
                       vocabulary={"great": 3, "screen": 2}).batch_requests(0)
    assert alone.batching is None
    for method in ("spell", "none"):
        expected = [alone.predict_proba(texts, method) for texts in calls]
        before = clf.batching
        got = _concurrently(lambda t, m=method: clf.predict_proba(t, m), [(t,) for t in calls])
        for e, g in zip(expected, got):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
        assert clf.batching.calls - before.calls == 12
    traced, name, seen = clf.predict_traced(["terible screen"], "spell")
    assert name == "spell" and seen == alone.repair_texts(["terible screen"], "spell")
    before = clf.batching
    _concurrently(lambda t: clf.predict_proba(t, "masked_ttt", steps=1), [(t,) for t in calls[:3]])
    assert clf.batching == before  # masked TTT adapts per call: never batched


def test_served_batching_settings_come_from_the_environment_and_bad_ones_are_refused():
    from ttt_pipeline.errors import ConfigError
    from ttt_pipeline.io.mlflow_model import batching_env

    assert batching_env({}) == (64, 0.0)
    assert batching_env({"TTT_SERVE_BATCH_TEXTS": "0", "TTT_SERVE_BATCH_WAIT_MS": "2.5"}) == (0, 2.5)
    for bad in ({"TTT_SERVE_BATCH_TEXTS": "many"}, {"TTT_SERVE_BATCH_WAIT_MS": "-1"}):
        with pytest.raises(ConfigError, match="TTT_SERVE_BATCH"):
            batching_env(bad)


def test_several_workers_split_the_cores_and_one_worker_keeps_torchs_default(monkeypatch):
    from pathlib import Path

    from ttt_pipeline.io import serving

    assert serving.threads_per_worker(2, cores=8) == 4 and serving.threads_per_worker(3, cores=2) == 1
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("ttt_pipeline.cores.available_cores", lambda: 16)
    env = serving.backend_env("m", "1", "sqlite:///x.db", Path("/bin"), workers=4)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "4"
    assert "OMP_NUM_THREADS" not in serving.backend_env("m", "1", "sqlite:///x.db", Path("/bin"))
