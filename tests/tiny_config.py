"""The one tiny pipeline configuration the end-to-end suites start from: a tiny random BERT and a slice of the
demo reviews (about 30 s a run). Suites override sections; a dict overrides key by key, anything else whole."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "demo" / "reviews.jsonl"


def tiny_config(tmp: Path, model_dir: Path, experiment: str = "tests", **sections) -> dict:
    cfg = {
        "data": {"path": str(DEMO), "text_column": "text", "label_column": "rating",
                 "label_names": ["1", "2", "3", "4", "5"], "max_train_samples": 60, "max_test_samples": 24},
        "model": {"name": str(model_dir), "max_length": 48, "head_hidden": [16]},
        "finetune": {"epochs": 2, "batch_size": 16, "alignment": "joint", "early_stopping_patience": 0,
                     # the suites' recipe, pinned when the library defaults moved to the measured one
                     "joint_passes": 2, "weighted_sampler": True, "precision": "auto"},
        "corruption": {"families": ["tutorial", "keyboard"], "severities": [1, 3], "seed": 1},
        "ttt": {"methods": ["none", "masked_ttt"], "batch_size": 8},
        "tracking": {"tracking_uri": f"sqlite:///{tmp}/mlflow.db", "artifact_root": str(tmp / "mlruns"),
                     "experiment": experiment},
        "store": str(tmp / "store"),
    }
    for name, values in sections.items():
        if isinstance(values, dict) and isinstance(cfg.get(name), dict):
            cfg[name] = {**cfg[name], **values}
        else:
            cfg[name] = values
    return cfg
