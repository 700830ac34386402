"""Two tiny pipeline runs with different settings in one MLflow store (shared by the registry and CLI tests)."""

from __future__ import annotations

import pytest
from tiny_config import tiny_config


@pytest.fixture(scope="session")
def two_runs(tmp_path_factory, tiny_bert_dir):
    """Run A (1 epoch, lr 1e-4) then run B (3 epochs, lr 2e-3): summaries and the tracking URI."""
    import prefect.settings
    from prefect.testing.utilities import prefect_test_harness

    from ttt_pipeline.config import PipelineConfig
    from ttt_pipeline.flows.pipeline import ttt_pipeline

    tmp = tmp_path_factory.mktemp("results")
    cfg_a = PipelineConfig.model_validate(tiny_config(tmp, tiny_bert_dir, suite="results", epochs=1, lr=1e-4,
                                                      run_name="run-a"))
    cfg_b = PipelineConfig.model_validate(tiny_config(tmp, tiny_bert_dir, suite="results", epochs=3, lr=2e-3,
                                                      run_name="run-b"))
    # Prefect's result records (the task cache) of this session only: no record of another test's store
    with prefect.settings.temporary_settings(
            updates={prefect.settings.PREFECT_RESULTS_LOCAL_STORAGE_PATH: str(tmp / "prefect-results")}):
        with prefect_test_harness(server_startup_timeout=120):
            a = ttt_pipeline(config=cfg_a)
            b = ttt_pipeline(config=cfg_b)
    return {"tmp": tmp, "uri": f"sqlite:///{tmp}/mlflow.db", "a": a, "b": b, "cfg_a": cfg_a, "cfg_b": cfg_b}
