"""Remote sources against local stand-ins: a local HTTP server for Google Drive, a mocked hub loader."""

from __future__ import annotations

import pytest
import torch

from ttt_pipeline.config import DataConfig
from ttt_pipeline.data.prepare import prepare_dataset
from ttt_pipeline.data.sources import Source, fetch_gdown, load_source
from ttt_pipeline.errors import DataError, DownloadError
from ttt_pipeline.storage import file_digest

TUTORIAL_ROWS = [(f"review {i} says {'good' if i % 2 else 'bad'} things", i % 5, torch.tensor([101, i, 102]))
                 for i in range(40)]


def test_source_parsing():
    assert Source.parse("gdown://abc") == Source("gdown", "abc")
    assert Source.parse("hf://amazon_polarity") == Source("hf", "amazon_polarity")
    assert Source.parse("hf://glue:sst2") == Source("hf", "glue", "sst2")
    assert Source.parse("data/x.csv").kind == "local"
    with pytest.raises(DataError):
        Source.parse("gdown://")


def test_gdown_downloads_tutorial_file_once_and_reads_it(drive, tmp_path):
    torch.save(TUTORIAL_ROWS, drive / "TRAINID")
    frames, digest = load_source("gdown://TRAINID", tmp_path / "raw", ["text", "label", "input_ids"])
    df = frames["all"]
    assert len(df) == 40 and df["text"][3] == "review 3 says good things" and df["label"][3] == 3
    assert digest == file_digest(drive / "TRAINID")
    (drive / "TRAINID").unlink()  # a second load is served from the raw cache, no network
    frames2, digest2 = load_source("gdown://TRAINID", tmp_path / "raw", ["text", "label", "input_ids"])
    assert digest2 == digest and len(frames2["all"]) == 40


def test_gdown_train_and_test_files_make_the_tutorial_splits(drive, tmp_path):
    torch.save(TUTORIAL_ROWS, drive / "TRAIN")
    torch.save(TUTORIAL_ROWS[:15], drive / "VAL")
    cfg = DataConfig(path="gdown://TRAIN", test_path="gdown://VAL", label_column="label",
                     label_names=["0", "1", "2", "3", "4"],
                     val_fraction=0.2)
    meta = prepare_dataset(cfg, tmp_path / "out", tmp_path / "raw")
    assert meta["sizes"] == {"train": 30, "test": 15, "validation": 10}


def test_gdown_failure_names_source_and_offline_alternative(drive, tmp_path):
    with pytest.raises(DownloadError) as exc:
        fetch_gdown("MISSING", tmp_path / "raw")
    assert "gdown://MISSING" in exc.value.message
    assert "offline" in exc.value.hint and "data.path" in exc.value.hint
    assert not list((tmp_path / "raw").glob("*.part"))


def test_gdown_sha256_mismatch_is_refused(drive, tmp_path):
    torch.save(TUTORIAL_ROWS, drive / "X")
    with pytest.raises(DownloadError, match="sha256"):
        fetch_gdown("X", tmp_path / "raw", sha256="0" * 64)
    assert not (tmp_path / "raw" / "gdown-X.pt").exists()


def test_hub_dataset_through_datasets_load_dataset(monkeypatch, tmp_path):
    import datasets

    calls = []

    def fake_load(name, config=None, **kw):
        calls.append((name, config))
        rows = {"sentence": [f"text {i}" for i in range(30)], "label": [i % 2 for i in range(30)]}
        return datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows),
                                     "test": datasets.Dataset.from_dict({k: v[:10] for k, v in rows.items()})})

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    cfg = DataConfig(path="hf://glue:sst2", text_column="sentence", label_column="label", label_names=None)
    meta = prepare_dataset(cfg, tmp_path / "out", tmp_path / "raw")
    assert calls == [("glue", "sst2")]
    assert meta["sizes"]["test"] == 10 and meta["label_names"] == ["0", "1"]


def test_hub_failure_names_source(monkeypatch, tmp_path):
    import datasets

    def offline(*a, **k):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DownloadError) as exc:
        load_source("hf://amazon_polarity", tmp_path, ["text"])
    assert "hf://amazon_polarity" in exc.value.message and "offline" in exc.value.hint


def test_missing_local_source_names_its_config_field(tmp_path):
    from ttt_pipeline import steps
    from ttt_pipeline.config import PipelineConfig
    from ttt_pipeline.data.sources import source_fingerprint

    with pytest.raises(DataError, match="check data.path"):
        source_fingerprint(str(tmp_path / "nope.csv"))
    cfg = PipelineConfig(data=DataConfig(shift={"kitchen": str(tmp_path / "gone")}))
    with pytest.raises(DataError, match=r"check data\.shift\.kitchen"):
        steps.download_inputs(cfg)


def test_download_key_follows_the_content_not_the_path_spelling(tmp_path):
    """The bundled demo is reached through the `data/demo` link and through its resolved target; both spellings
    (and a copy of the same bytes) share one cached download, while other bytes make a new one."""
    from ttt_pipeline import steps
    from ttt_pipeline.config import PipelineConfig

    real = tmp_path / "real" / "reviews.jsonl"
    real.parent.mkdir()
    real.write_text('{"text": "good", "rating": 5}\n')
    (tmp_path / "link").symlink_to(real.parent)
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(real.read_bytes())

    def key(path):
        return steps.download_inputs(PipelineConfig(data=DataConfig(path=str(path))))

    assert key(tmp_path / "link" / "reviews.jsonl") == key(real) == key(copy)
    copy.write_text('{"text": "bad", "rating": 1}\n')
    assert key(copy) != key(real)
