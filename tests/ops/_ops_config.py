"""The operations tests' tiny configuration: tests/tiny_config.py, smaller and without the registry."""

from __future__ import annotations

from pathlib import Path

from tiny_config import tiny_config as _base


def tiny_config(tmp: Path, model_dir: Path, tracking_uri: str | None = None, **execution) -> dict:
    cfg = _base(tmp, model_dir, "ops",
                data={"max_train_samples": 40, "max_test_samples": 16}, model={"max_length": 32},
                finetune={"epochs": 1, "mlm_warmup_max_steps": 10},
                corruption={"families": ["tutorial"], "severities": [3]}, registry={"enabled": False})
    if tracking_uri:
        cfg["tracking"]["tracking_uri"] = tracking_uri
    if execution:
        cfg["execution"] = execution
    return cfg
