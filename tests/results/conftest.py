"""Two tiny pipeline runs with different settings in one MLflow store (shared by the registry and CLI tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def tiny_config(tmp: Path, model_dir: Path, epochs: int = 1, lr: float = 1e-4, run_name: str | None = None) -> dict:
    """A demo-like configuration on a tiny random BERT and a slice of the demo reviews (about 30 s a run)."""
    return {
        "data": {"path": str(REPO / "data/demo/reviews.jsonl"), "text_column": "text", "label_column": "rating",
                 "label_names": ["1", "2", "3", "4", "5"], "max_train_samples": 80, "max_test_samples": 24},
        "model": {"name": str(model_dir), "max_length": 48, "head_hidden": [16]},
        "finetune": {"epochs": epochs, "lr": lr, "batch_size": 16, "alignment": "joint",
                     "early_stopping_patience": 0},
        "corruption": {"families": ["tutorial", "keyboard"], "severities": [2, 4], "seed": 1},
        "ttt": {"methods": ["none", "masked_ttt"], "batch_size": 8},
        "tracking": {"tracking_uri": f"sqlite:///{tmp}/mlflow.db", "artifact_root": str(tmp / "mlruns"),
                     "experiment": "results", "run_name": run_name},
        "registry": {"model_name": "tiny-review-classifier", "metric": "acc_ttt"},
        "store": str(tmp / "store"),
    }


@pytest.fixture(scope="session")
def two_runs(tmp_path_factory, tiny_bert_dir):
    """Run A (1 epoch, lr 1e-4) then run B (3 epochs, lr 2e-3): summaries and the tracking URI."""
    import prefect.settings
    from prefect.testing.utilities import prefect_test_harness

    from flows.pipeline import ttt_pipeline
    from ttt_pipeline.config import PipelineConfig

    tmp = tmp_path_factory.mktemp("results")
    cfg_a = PipelineConfig.model_validate(tiny_config(tmp, tiny_bert_dir, epochs=1, lr=1e-4, run_name="run-a"))
    cfg_b = PipelineConfig.model_validate(tiny_config(tmp, tiny_bert_dir, epochs=3, lr=2e-3, run_name="run-b"))
    # Prefect's result records (the task cache) of this session only: no record of another test's store
    with prefect.settings.temporary_settings(
            updates={prefect.settings.PREFECT_RESULTS_LOCAL_STORAGE_PATH: str(tmp / "prefect-results")}):
        with prefect_test_harness(server_startup_timeout=120):
            a = ttt_pipeline(config=cfg_a)
            b = ttt_pipeline(config=cfg_b)
    return {"tmp": tmp, "uri": f"sqlite:///{tmp}/mlflow.db", "a": a, "b": b, "cfg_a": cfg_a, "cfg_b": cfg_b}
