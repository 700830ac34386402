"""The download step's validation, label mapping, stratified splits and digests."""

from __future__ import annotations

import json

import pytest

from ttt_pipeline.config import DataConfig
from ttt_pipeline.data.labels import canonical
from ttt_pipeline.data.prepare import load_prepared, prepare_dataset
from ttt_pipeline.data.splits import stratified_cap
from ttt_pipeline.errors import DataError


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _rows(n_per_class=20, classes=(1, 2, 3)):
    return [{"review": f"review number {i} of class {c} is here", "stars": c}
            for c in classes for i in range(n_per_class)]


def test_canonical_labels():
    assert canonical(4) == canonical(4.0) == canonical("4.0") == canonical(" 4 ") == "4"
    assert canonical("positive") == "positive"
    assert canonical(None) is None and canonical(float("nan")) is None and canonical("  ") is None


def test_splits_are_stratified_seeded_and_digest_stable(tmp_path):
    src = _jsonl(tmp_path / "r.jsonl", _rows())
    cfg = DataConfig(path=str(src), text_column="review", label_column="stars", label_names=None,
                     test_fraction=0.25, val_fraction=0.2)
    m1 = prepare_dataset(cfg, tmp_path / "a", tmp_path / "raw")
    m2 = prepare_dataset(cfg, tmp_path / "b", tmp_path / "raw")
    assert m1["content_digest"] == m2["content_digest"]
    assert m1["label_names"] == ["1", "2", "3"]
    assert m1["sizes"] == {"train": 36, "validation": 9, "test": 15}
    assert all(v == 5 for v in m1["class_counts"]["test"].values())
    ds, labels = load_prepared(tmp_path / "a")
    assert labels == {"0": "1", "1": "2", "2": "3"}
    assert not set(ds["train"]["text"]) & set(ds["test"]["text"])
    m3 = prepare_dataset(cfg.model_copy(update={"split_seed": 7}), tmp_path / "c", tmp_path / "raw")
    assert m3["content_digest"] != m1["content_digest"]


def test_empty_texts_and_missing_labels_are_dropped_and_counted(tmp_path):
    rows = _rows() + [{"review": "   ", "stars": 1}, {"review": "no label", "stars": None}]
    cfg = DataConfig(path=str(_jsonl(tmp_path / "r.jsonl", rows)), text_column="review", label_column="stars",
                     label_names=None)
    meta = prepare_dataset(cfg, tmp_path / "o", tmp_path / "raw")
    assert meta["dropped_empty_text"] == 1 and meta["dropped_missing_label"] == 1
    assert sum(meta["sizes"].values()) == 60


def test_missing_column_names_field_and_columns(tmp_path):
    cfg = DataConfig(path=str(_jsonl(tmp_path / "r.jsonl", _rows())), text_column="body", label_column="stars",
                     label_names=None)
    with pytest.raises(DataError) as exc:
        prepare_dataset(cfg, tmp_path / "o", tmp_path / "raw")
    assert "['body'] not found" in exc.value.message and "review" in exc.value.message
    assert "data.text_column" in exc.value.hint


def test_label_outside_classes(tmp_path):
    cfg = DataConfig(path=str(_jsonl(tmp_path / "r.jsonl", _rows(classes=(1, 2, 7)))), text_column="review",
                     label_column="stars", label_names=["1", "2", "3"])
    with pytest.raises(DataError, match=r"labels \['7'\] are outside the classes"):
        prepare_dataset(cfg, tmp_path / "o", tmp_path / "raw")


def test_mixed_label_types(tmp_path):
    rows = _rows() + [{"review": "text label", "stars": "great"}] * 3
    cfg = DataConfig(path=str(_jsonl(tmp_path / "r.jsonl", rows)), text_column="review", label_column="stars",
                     label_names=None)
    with pytest.raises(DataError, match="mixed types"):
        prepare_dataset(cfg, tmp_path / "o", tmp_path / "raw")


def test_class_too_small_to_split(tmp_path):
    rows = _rows() + [{"review": "the only five star review", "stars": 5}]
    cfg = DataConfig(path=str(_jsonl(tmp_path / "r.jsonl", rows)), text_column="review", label_column="stars",
                     label_names=None)
    with pytest.raises(DataError, match="class '5' has 1 review"):
        prepare_dataset(cfg, tmp_path / "o", tmp_path / "raw")


def test_caps_keep_class_proportions():
    labels = [0] * 60 + [1] * 30 + [2] * 10
    idx = stratified_cap(labels, 20, seed=1)
    assert len(idx) == 20
    assert [sum(labels[i] == c for i in idx) for c in range(3)] == [12, 6, 2]
    assert idx == stratified_cap(labels, 20, seed=1)


def test_shift_sets_are_added(tmp_path):
    src = _jsonl(tmp_path / "r.jsonl", _rows())
    other = _jsonl(tmp_path / "o.jsonl", _rows(5))
    cfg = DataConfig(path=str(src), text_column="review", label_column="stars", label_names=None,
                     shift={"other": str(other)})
    meta = prepare_dataset(cfg, tmp_path / "o", tmp_path / "raw")
    assert meta["sizes"]["shift_other"] == 15
