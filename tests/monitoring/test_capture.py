"""Capture through the served model (the pyfunc, as `mlflow models serve` loads it) and `ttt-pipeline predict`:
the rows it records, the text it keeps or not, and every fault that must not fail a request (a store that cannot
be written, a descriptor that raises, NUL bytes, invalid Unicode, a 1 MB review)."""

from __future__ import annotations

import json
import threading

import numpy as np
import pyarrow.parquet as pq
import pytest
from monitoring_helpers import LABELS, TEXTS

from ttt_pipeline.io import traffic_recorder
from ttt_pipeline.io.traffic_capture import TRAFFIC_SCHEMA

TYPO = "Teh battery lasst all day and the sound is claer"  # spell repairs three of its ten words


def _pyfunc(model_dir, monkeypatch, uri, **env):
    """The model as MLflow loads it, with the capture environment `ttt-pipeline serve` would set."""
    import mlflow.pyfunc

    monkeypatch.setenv("TTT_DEVICE", "cpu")
    for key, value in {traffic_recorder.ENV_CAPTURE: "1", traffic_recorder.ENV_URI: str(uri), **env}.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    return mlflow.pyfunc.load_model(str(model_dir))


def _impl(model):
    """The PyfuncClassifier behind a loaded pyfunc (MLflow wraps a loader module's object without unwrapping)."""
    return model._model_impl


def _rows(uri) -> list[dict]:
    parts = sorted(uri.glob("date=*/part-*.parquet"))
    return [r for p in parts for r in pq.read_table(p).to_pylist()]


def _closed(impl) -> dict:
    impl.recorder.close()  # flushes the writer's queue, as the process's exit does
    return impl.recorder.stats()


def test_served_predictions_are_recorded_with_their_descriptors(spell_model_dir, monkeypatch, tmp_path):
    from ttt_pipeline.evaluation.descriptors import text_descriptors, training_scripts

    uri = tmp_path / "traffic"
    model = _pyfunc(spell_model_dir, monkeypatch, uri, TTT_MODEL_NAME="reviews", TTT_MODEL_VERSION="7")
    impl = _impl(model)
    texts = [TEXTS[0], TYPO, "word " * 60]  # the last is longer than the model's 48 tokens
    answered = model.predict(texts)
    plain = impl.classifier.predict(texts, "spell")
    assert [a["label"] for a in answered] == [p["label"] for p in plain]
    assert [a["probability"] for a in answered] == pytest.approx([p["probability"] for p in plain], abs=1e-6)
    stats = _closed(impl)
    assert (stats["written"], stats["dropped"], stats["recorded"], stats["failed"]) == (3, 0, 3, 0)
    rows = _rows(uri)
    assert [list(r) for r in rows] == [TRAFFIC_SCHEMA.names] * 3
    assert [r["text"] for r in rows] == texts
    assert {(r["model_name"], r["model_version"], r["method"]) for r in rows} == {("reviews", "7", "spell")}
    assert [r["label"] for r in rows] == [a["label"] for a in answered]
    assert [r["probability"] for r in rows] == pytest.approx([a["probability"] for a in answered], abs=1e-6)
    assert [r["truncated"] for r in rows] == [False, False, True]
    clf = impl.classifier
    repaired = clf.repair_texts(texts, "spell")
    assert repaired[1] != TYPO and repaired[0] == TEXTS[0]
    # raw_label only where the repair changed the text: the prediction of the unrepaired text, by `none`
    raw = clf.predict([TYPO], "none")[0]["label"]
    assert [r["raw_label"] for r in rows] == [None, raw, None]
    # the training texts' scripts, as the calibration reads them off the training data
    want = text_descriptors(texts, repaired, frozenset(clf.vocabulary), training_scripts(TEXTS * 2))
    for name, values in want.items():
        assert [r[name] for r in rows] == pytest.approx(list(values), abs=1e-6), name
    assert rows[1]["repaired_words_share"] == pytest.approx(0.3)


def test_no_text_is_kept_when_store_text_is_off(spell_model_dir, monkeypatch, tmp_path):
    uri = tmp_path / "traffic"
    model = _pyfunc(spell_model_dir, monkeypatch, uri, TTT_MONITORING_STORE_TEXT="0",
                       TTT_MODEL_NAME=None, TTT_MODEL_VERSION=None)
    model.predict(TEXTS)
    assert _closed(_impl(model))["written"] == len(TEXTS)
    rows = _rows(uri)
    assert len(rows) == len(TEXTS) and all(r["text"] is None for r in rows)
    assert all(r["word_count"] > 0 and r["label"] in LABELS for r in rows)  # the rest is recorded
    # served by `mlflow models serve` directly: no name or version told; a saved (unlogged) model has no run id
    assert {(r["model_name"], r["model_version"]) for r in rows} == {("unknown", "unknown")}
    raw = b"".join(p.read_bytes() for p in uri.rglob("*.parquet"))
    assert b"battery" not in raw and b"keyboard" not in raw  # nowhere in the files, not only null in the column


def test_capture_off_records_nothing(spell_model_dir, monkeypatch, tmp_path):
    model = _pyfunc(spell_model_dir, monkeypatch, tmp_path / "traffic", TTT_MONITORING_CAPTURE="0")
    assert _impl(model).recorder is None
    model.predict(TEXTS[:2])
    assert not (tmp_path / "traffic").exists()


def test_an_unwritable_store_never_fails_a_request(spell_model_dir, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    model = _pyfunc(spell_model_dir, monkeypatch, blocker / "traffic")
    impl = _impl(model)
    for _ in range(3):
        assert len(model.predict(TEXTS)) == len(TEXTS)
    stats = _closed(impl)
    assert stats["written"] == 0 and stats["dropped"] == 3 * len(TEXTS) and stats["failed_parts"] >= 1


def test_a_failing_descriptor_is_counted_and_the_answer_stands(spell_model_dir, monkeypatch, tmp_path, caplog):
    import ttt_pipeline.evaluation.descriptors as descriptors

    model = _pyfunc(spell_model_dir, monkeypatch, tmp_path / "traffic")
    impl = _impl(model)
    want = impl.classifier.predict(TEXTS, "spell")

    def broken(*args, **kwargs):
        raise RuntimeError("descriptor bug")

    monkeypatch.setattr(descriptors, "text_descriptors", broken)
    with caplog.at_level("WARNING", logger="ttt_pipeline.io.traffic_recorder"):
        for _ in range(2):
            got = model.predict(TEXTS)
            assert [g["label"] for g in got] == [w["label"] for w in want]
    stats = _closed(impl)
    assert stats["failed"] == 2 * len(TEXTS) and stats["recorded"] == 0 and "descriptor bug" in stats[
        "last_capture_error"]
    assert sum("not recorded" in r.message for r in caplog.records) == 1  # one line a minute, not one a request


def test_nul_bytes_invalid_unicode_and_a_megabyte_review(spell_model_dir, monkeypatch, tmp_path):
    from mlflow.exceptions import MlflowException

    uri = tmp_path / "traffic"
    model = _pyfunc(spell_model_dir, monkeypatch, uri)
    impl = _impl(model)
    huge = "good " * 200_000  # 1,000,000 characters
    texts = ["nul\x00inside the review", "\x00", huge]
    answered = model.predict(texts)
    assert len(answered) == 3 and all(a["label"] in LABELS for a in answered)
    # a lone surrogate (an undecodable byte, decoded with surrogateescape) is refused with a clear message, by
    # MLflow's schema check when served and by the model's own check behind it; nothing is recorded for it
    for call in (model.predict, impl.predict):
        with pytest.raises(MlflowException, match="not valid Unicode|surrogates not allowed"):
            call(["fine", b"caf\xe9".decode("utf-8", "surrogateescape")])
    stats = _closed(impl)
    assert (stats["written"], stats["failed"], stats["dropped"]) == (3, 0, 0)
    rows = _rows(uri)
    assert [r["text"] for r in rows[:2]] == texts[:2]  # NUL kept
    # cut to data.max_text_chars (20,000) before scoring, as the data step cuts reviews; the answer says so
    assert rows[2]["text"] == huge[:20_000] and rows[2]["text_length"] == 20_000 and answered[2]["truncated"]
    assert rows[2]["word_count"] == 4_000 and rows[2]["truncated"] is True and rows[1]["word_count"] == 0


def test_the_same_answers_with_capture_on_and_off(spell_model_dir, monkeypatch, tmp_path):
    """Capture moves the repair out of predict_texts; the probabilities must not move by a bit."""
    on = _pyfunc(spell_model_dir, monkeypatch, tmp_path / "traffic")
    clf = _impl(on).classifier
    for method in ("spell", "none", "spell+masked_ttt"):
        probs, name, seen = clf.predict_traced(TEXTS + [TYPO], method, steps=1, batch_size=2)
        np.testing.assert_array_equal(probs, clf.predict_proba(TEXTS + [TYPO], method, steps=1, batch_size=2))
        assert name == method and (seen is None) == (method == "none")
    _closed(_impl(on))


def test_predict_command_captures_a_file(spell_model_dir, tmp_path, capsys):
    from ttt_pipeline.cli.main import main

    reviews = tmp_path / "reviews.jsonl"
    reviews.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS + [TYPO]))
    uri = tmp_path / "traffic"
    rc = main(["predict", "--model", str(spell_model_dir), "--input", str(reviews), "--output",
               str(tmp_path / "out.jsonl"), "--capture", str(uri), "--capture-no-text", "--quiet", "--json",
               "--device", "cpu"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["capture"]["written"] == len(TEXTS) + 1 and summary["capture"]["uri"] == str(uri)
    rows = _rows(uri)
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows] == [o["label"] for o in out]
    assert all(r["text"] is None and r["method"] == "spell" for r in rows)
    assert [r["raw_label"] is not None for r in rows] == [False] * len(TEXTS) + [True]


def test_serve_passes_the_monitoring_section_to_its_back_ends(monkeypatch, tmp_path):
    from pathlib import Path

    from ttt_pipeline.config import load_config
    from ttt_pipeline.io.serving import backend_env

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(traffic_recorder.ENV_CAPTURE, "1")  # a stale variable of the shell: the config decides
    off = backend_env("reviews", "3", "sqlite:///x.db", Path("/bin"), load_config(None).monitoring)
    assert traffic_recorder.ENV_CAPTURE not in off
    on = backend_env("reviews", "3", "sqlite:///x.db", Path("/bin"), load_config(
        None, ["monitoring.capture=true", "monitoring.store_text=false"]).monitoring)
    assert {k: on[k] for k in on if k.startswith("TTT_M")} == {
        "TTT_MONITORING_CAPTURE": "1", "TTT_MONITORING_TRAFFIC_URI": str(tmp_path / "traffic"),
        "TTT_MONITORING_STORE_TEXT": "0", "TTT_MODEL_NAME": "reviews", "TTT_MODEL_VERSION": "3"}
    settings = traffic_recorder.CaptureSettings.from_env(on)
    assert settings == traffic_recorder.CaptureSettings(str(tmp_path / "traffic"), False, "reviews", "3")
    from ttt_pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="TTT_MONITORING_CAPTURE"):
        traffic_recorder.CaptureSettings.from_env({"TTT_MONITORING_CAPTURE": "maybe"})


def test_the_vocabularys_scripts_weigh_each_word_by_its_count():
    from ttt_pipeline.evaluation.descriptors import training_scripts
    from ttt_pipeline.io.traffic_recorder import vocabulary_scripts

    # 99 Latin letters a word: 100 occurrences of a Cyrillic word of 1 letter in 10,000 letters is 1 %
    vocab = {"a" * 99: 99, "я": 100}
    assert vocabulary_scripts(vocab) == {"LATIN", "CYRILLIC"} == training_scripts(["a" * 99] * 99 + ["я"] * 100)
    assert vocabulary_scripts({"a" * 99: 99, "я": 50}) == {"LATIN"}  # 0.5 %: a few borrowed names
    assert vocabulary_scripts({}) == frozenset()


def test_truncated_agrees_with_tokenising_the_whole_text(spell_model_dir):
    """The head-first shortcut gives the whole tokenisation's answer, at the boundary and for long texts whose
    head is one long word, no spaces at all, or only newlines."""
    from ttt_pipeline.io.mlflow_model import load_classifier

    clf = load_classifier(spell_model_dir, device="cpu")
    n = clf.max_length
    texts = ["word " * k for k in (n - 3, n - 2, n - 1, n)] + ["battery " * 2000, "x" * 5000 + " ok",
                                                                "y" * 5000, "z\n" * 3000, "a " * 10 + "q" * 900,
                                                                "unbelievably " * (n // 2), ""]
    want = [len(clf.tokenizer(t)["input_ids"]) > n for t in texts]
    assert clf.truncated(texts) == want
    assert want[:4] == [False, False, True, True]  # n - 2 words and [CLS] [SEP] fill it exactly


def test_truncated_holds_while_other_threads_tokenise_for_the_model(spell_model_dir):
    """A fast tokenizer keeps its truncation setting in shared state: `truncated` (which reads max_length + 1
    tokens, outside the model's lock) must not read the max_length the predictions of other threads set."""
    from ttt_pipeline.io.mlflow_model import load_classifier

    clf = load_classifier(spell_model_dir, device="cpu")
    long_texts = ["battery life " * clf.max_length] * 8
    stop, answers = threading.Event(), []

    def predict_loop():
        while not stop.is_set():
            clf.predict(long_texts, "none")
            clf.tokenizer(long_texts, truncation=True, max_length=clf.max_length)

    thread = threading.Thread(target=predict_loop)
    thread.start()
    try:
        for _ in range(300):
            answers.extend(clf.truncated(long_texts[:2]))
    finally:
        stop.set()
        thread.join(30)
    assert answers == [True] * 600
