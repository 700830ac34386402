"""Helpers shared by the operations tests: the tiny configuration of tests/flows/test_pipeline_e2e.py."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def tiny_config(tmp: Path, model_dir: Path, tracking_uri: str | None = None, **execution) -> dict:
    cfg = {
        "data": {"path": str(REPO / "data/demo/reviews.jsonl"), "text_column": "text", "label_column": "rating",
                 "label_names": ["1", "2", "3", "4", "5"], "max_train_samples": 40, "max_test_samples": 16},
        "model": {"name": str(model_dir), "max_length": 32, "head_hidden": [16]},
        "finetune": {"epochs": 1, "batch_size": 16, "alignment": "joint", "early_stopping_patience": 0,
                     "mlm_warmup_max_steps": 10},
        "corruption": {"families": ["tutorial"], "severities": [3], "seed": 1},
        "ttt": {"methods": ["none", "masked_ttt"], "batch_size": 8},
        "tracking": {"tracking_uri": tracking_uri or f"sqlite:///{tmp}/mlflow.db",
                     "artifact_root": str(tmp / "mlruns"), "experiment": "ops"},
        "registry": {"enabled": False},
        "store": str(tmp / "store"),
    }
    if execution:
        cfg["execution"] = execution
    return cfg
