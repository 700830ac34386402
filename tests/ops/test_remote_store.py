"""The step store on an fsspec URL: local working caches synced by step and key, checked by digest."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import fsspec
import pytest

from ttt_pipeline.errors import PipelineError
from ttt_pipeline.io.remote_store import SyncedStepStore, is_url, localise, open_store, peek
from ttt_pipeline.storage import StepStore


def _build(text: str):
    def build(tmp: Path) -> dict:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "data.txt").write_text(text)
        (tmp / "top.json").write_text(json.dumps({"n": len(text)}))
        return {"n": len(text)}

    return build


@pytest.fixture
def url():
    u = f"memory://ttt-tests/{uuid.uuid4().hex}/store"
    yield u
    fs, path = fsspec.core.url_to_fs(u)
    fs.rm(path, recursive=True) if fs.exists(path) else None


def test_open_store_picks_the_backend(tmp_path, url):
    assert type(open_store(tmp_path)) is StepStore and not is_url(tmp_path)
    assert isinstance(open_store(url), SyncedStepStore) and is_url(url)


def test_output_travels_between_machines_by_key(tmp_path, url):
    a = SyncedStepStore(url, tmp_path / "machine-a")
    out = a.run("demo", {"x": 1}, _build("hello"), "1")
    assert not out.cached and Path(out.path).is_relative_to(tmp_path / "machine-a")
    fs, base = fsspec.core.url_to_fs(url)
    assert fs.exists(f"{base}/demo/{out.key}/manifest.json") and fs.exists(f"{base}/demo/{out.key}/sub/data.txt")

    b = SyncedStepStore(url, tmp_path / "machine-b")  # another machine: empty cache, same URL
    assert peek(b, "demo", out.key).digest == out.digest and not Path(b.entry("demo", out.key)).exists()
    calls = []
    again = b.run("demo", {"x": 1}, lambda tmp: calls.append(1) or {}, "1")
    assert calls == [] and again.cached and again.digest == out.digest  # pulled, not rebuilt
    assert (Path(again.path) / "sub" / "data.txt").read_text() == "hello"

    c = SyncedStepStore(url, tmp_path / "machine-c")
    moved = localise(c, {**out.to_dict(), "path": "/elsewhere/not/here"})
    assert Path(moved["path"]).is_relative_to(tmp_path / "machine-c") and moved["digest"] == out.digest


def test_incomplete_or_damaged_remote_copies_are_never_used(tmp_path, url):
    a = SyncedStepStore(url, tmp_path / "a")
    out = a.run("demo", {"x": 2}, _build("payload"), "1")
    fs, base = fsspec.core.url_to_fs(url)
    with fs.open(f"{base}/demo/{out.key}/sub/data.txt", "wb") as f:
        f.write(b"tampered")
    with pytest.raises(PipelineError, match="does not match its manifest digest"):
        SyncedStepStore(url, tmp_path / "b").load("demo", out.key)
    fs.rm(f"{base}/demo/{out.key}/manifest.json")  # an upload cut short: no manifest, no entry
    fresh = SyncedStepStore(url, tmp_path / "c")
    assert fresh.load("demo", out.key) is None
    rebuilt = fresh.run("demo", {"x": 2}, _build("payload"), "1")
    assert not rebuilt.cached and rebuilt.digest == out.digest
    assert SyncedStepStore(url, tmp_path / "d").load("demo", out.key).digest == out.digest


def test_localise_without_a_shared_store_says_how_to_fix_it(tmp_path):
    plain = StepStore(tmp_path / "store")
    with pytest.raises(PipelineError, match="fsspec URL"):
        localise(plain, {"step": "demo", "key": "k" * 24, "path": "/nowhere", "digest": "d"})


def test_pipeline_steps_on_a_file_url(tmp_path):
    """The real download step through a file:// URL (what a mounted bucket or NFS share looks like)."""
    from ttt_pipeline import steps
    from ttt_pipeline.config import PipelineConfig

    repo = Path(__file__).resolve().parents[2]
    cfg = PipelineConfig.model_validate({
        "data": {"path": str(repo / "data/demo/reviews.jsonl"), "label_column": "rating",
                 "label_names": ["1", "2", "3", "4", "5"], "max_train_samples": 20, "max_test_samples": 8},
        "store": (tmp_path / "shared").as_uri()})
    first = steps.download(cfg, SyncedStepStore(cfg.store, tmp_path / "cache-1"))
    assert (tmp_path / "shared" / "download" / first.key / "manifest.json").is_file()
    second = steps.download(cfg, SyncedStepStore(cfg.store, tmp_path / "cache-2"))
    assert second.cached and second.digest == first.digest
