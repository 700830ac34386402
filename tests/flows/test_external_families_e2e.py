"""The flow with the misspelling family and an external generator (issue 36): the ext: sets are scored and logged
apart from the own suite, and every method's worst case and harm flag reach the summary and MLflow."""

from __future__ import annotations

import pytest
from tiny_config import tiny_config

from ttt_pipeline.config import PipelineConfig

pytestmark = pytest.mark.slow


def test_pipeline_scores_external_sets_apart_and_reports_the_worst_case(tmp_path, tiny_bert_dir):
    from mlflow.tracking import MlflowClient
    from prefect.testing.utilities import prefect_test_harness

    from ttt_pipeline.flows.pipeline import ttt_pipeline
    from ttt_pipeline.reports.run import headline_table

    cfg = PipelineConfig.model_validate(tiny_config(
        tmp_path, tiny_bert_dir, "external", corruption={"families": ["misspelling", "ext:keyboard"],
                                                          "severities": [3], "seed": 1},
        ttt={"methods": ["none", "spell"], "batch_size": 8}, evaluation={"default_defense": "spell"}))
    with prefect_test_harness(server_startup_timeout=120):
        summary = ttt_pipeline(config=cfg)
    assert set(summary["gains"]["spell"]) >= {"corrupted", "external"}
    assert "external_drop" in summary and summary["defense_external_gain"]["method"] == "spell"
    w = summary["worst_case"]["spell"]
    # every scored set: the two corrupted ones and clean text (a repair may harm clean input too)
    assert w["n_sets"] == 3 and w["set"] in ("misspelling-3", "ext:keyboard-3", "clean")
    assert isinstance(w["harm"], bool)
    assert 0.0 <= summary["acc_external"] <= 1.0
    metrics = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(summary["mlflow_run_id"]).data.metrics
    assert metrics["harm/spell"] == float(w["harm"]) and metrics["worst/spell"] == pytest.approx(w["delta"])
    assert "gain/ext:keyboard/3/spell" in metrics and "external_drop_ci_low" in metrics
    assert "worst case per defense" in headline_table(summary)
