"""The attribute step in the flow: an enabled run gains one cached task, one MLflow child run and one Prefect
table; the disabled run (tests/flows/test_pipeline_e2e.py) has none of them."""

from __future__ import annotations

import json

import pytest
from tiny_config import tiny_config

from ttt_pipeline.config import PipelineConfig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_bert_dir):
    from prefect.testing.utilities import prefect_test_harness

    from ttt_pipeline.flows.pipeline import ttt_pipeline

    tmp = tmp_path_factory.mktemp("attr-flow")
    cfg = PipelineConfig.model_validate(tiny_config(
        tmp, tiny_bert_dir, "attr-flow", finetune={"epochs": 1}, corruption={"families": ["keyboard"]},
        registry={"enabled": False},
        attribution={"enabled": True, "proj_dim": 16, "top_k": 3, "max_targets": 4, "batch_size": 32}))
    with prefect_test_harness(server_startup_timeout=120):
        first = ttt_pipeline(config=cfg)
        second = ttt_pipeline(config=cfg)
        table = _artifact("attribution")
    return tmp, cfg, first, second, table


def _artifact(key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as c:
        arts = c.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    data = arts[-1].data
    return json.loads(data) if isinstance(data, str) else data


def test_enabled_attribution_is_a_sixth_cached_task(runs):
    _, _, first, second, _ = runs
    assert first["cached"]["attribute"] is False and len(first["cached"]) == 6
    assert second["cached_tasks"] == 6 and all(second["cached"].values())


def test_attribute_child_run_and_table(runs):
    from mlflow.tracking import MlflowClient

    tmp, cfg, first, _, table = runs
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    parent = client.get_run(first["mlflow_run_id"])
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    by_name = {c.info.run_name: c for c in children}
    assert set(by_name) == {"download", "tokenise", "corrupt", "finetune", "evaluate", "attribute"}
    attr = by_name["attribute"]
    assert attr.data.metrics["n_train"] > 0 and "n_targets" in attr.data.metrics
    names = {a.path for a in client.list_artifacts(attr.info.run_id)}
    assert "attribution_targets.json" in names
    # the tiny random model predicts one class everywhere: nothing flips, and the table says so
    n = int(attr.data.metrics["n_targets"])
    assert len(table) == (n * 2 * 3 if n else 1)
