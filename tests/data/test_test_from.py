"""The download step records where the test reviews came from: split off here, the source's own split, or
data.test_path (what `evaluate --model` warns about when a brought model may have trained on them)."""

from __future__ import annotations

import json

from tiny_config import DEMO

from ttt_pipeline import steps
from ttt_pipeline.config import load_config
from ttt_pipeline.storage import StepStore


def download(tmp_path, *sets: str):
    cfg = load_config("demo", [f"store={tmp_path / 'store'}", "data.max_train_samples=40", *sets])
    return steps.download(cfg, StepStore(cfg.store)).meta


def test_the_preset_split_the_demo_test_reviews_off_itself(tmp_path):
    meta = download(tmp_path)
    assert meta["test_from"] == "split" and meta["sizes"]["test"] == 129


def test_a_test_file_of_ones_own_is_recorded_as_such(tmp_path):
    rows = [json.loads(line) for line in DEMO.read_text().splitlines()]
    test = tmp_path / "held_out.jsonl"
    test.write_text("".join(json.dumps(r) + "\n" for r in rows[:60]))
    meta = download(tmp_path, f"data.test_path={test}")
    assert meta["test_from"] == "test_path" and meta["sizes"]["test"] == sum(r["rating"] != 3 for r in rows[:60])
