"""The one tiny pipeline configuration the end-to-end suites start from: a tiny random BERT and a slice of the
demo reviews (about 30 s a run). A suite's preset (SUITES) and then the caller's sections are laid over it: a
dict overrides key by key, anything else whole."""

from __future__ import annotations

import copy
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "demo" / "reviews.jsonl"

# What each suite changes in the base configuration; its name is also its default MLflow experiment.
SUITES = {
    # smaller, one corruption set, no registry
    "ops": {"data": {"max_train_samples": 40, "max_test_samples": 16}, "model": {"max_length": 32},
            "finetune": {"epochs": 1, "mlm_warmup_max_steps": 10},
            "corruption": {"families": ["tutorial"], "severities": [3]}, "registry": {"enabled": False}},
    # one corruption set
    "reliability": {"corruption": {"families": ["tutorial"], "severities": [1]}},
    # two runs in one store, registered under one name
    "results": {"data": {"max_train_samples": 80}, "finetune": {"epochs": 1, "lr": 1e-4},
                "corruption": {"severities": [2, 4]}, "tracking": {"run_name": None},
                "registry": {"model_name": "tiny-review-classifier", "metric": "acc_ttt"}},
}


def tiny_config(tmp: Path, model_dir: Path, experiment: str | None = None, *, suite: str | None = None,
                epochs: int | None = None, lr: float | None = None, run_name: str | None = None,
                tracking_uri: str | None = None, execution: dict | None = None, **sections) -> dict:
    """The tiny configuration with its files under `tmp`. `suite` lays that suite's preset over the base;
    `sections` (data={...}, ttt={...}, ...) come next; then the shortcuts that are not None: epochs and lr
    (finetune), run_name and tracking_uri (tracking), execution (the whole section). The experiment is
    `experiment`, else the suite's name, else "tests"."""
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
                     "experiment": experiment or suite or "tests"},
        "store": str(tmp / "store"),
    }
    shortcuts = {"finetune": {"epochs": epochs, "lr": lr}, "tracking": {"run_name": run_name,
                                                                         "tracking_uri": tracking_uri}}
    layers = [copy.deepcopy(SUITES[suite]) if suite else {}, sections,
              {name: {k: v for k, v in values.items() if v is not None} for name, values in shortcuts.items()},
              {"execution": execution} if execution else {}]
    for layer in layers:
        for name, values in layer.items():
            if isinstance(values, dict) and isinstance(cfg.get(name), dict):
                cfg[name] = {**cfg[name], **values}
            else:
                cfg[name] = values
    return cfg
