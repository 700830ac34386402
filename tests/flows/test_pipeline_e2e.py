"""The whole flow on a tiny random BERT (real WordPiece vocabulary) and a slice of the demo reviews."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tiny_config import tiny_config
from ttt_pipeline.config import PipelineConfig

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_bert_dir):
    from flows.pipeline import ttt_pipeline
    from prefect.testing.utilities import prefect_test_harness

    tmp = tmp_path_factory.mktemp("e2e")
    cfg = PipelineConfig.model_validate(tiny_config(tmp, tiny_bert_dir, "e2e"))
    with prefect_test_harness(server_startup_timeout=120):
        first = ttt_pipeline(config=cfg)
        second = ttt_pipeline(config=cfg)
    return tmp, cfg, first, second


def test_first_run_scores_every_set(runs):
    _, _, first, _ = runs
    for key in ("acc_clean", "acc_corrupted", "acc_ttt", "acc_clean_ttt"):
        assert 0.0 <= first[key] <= 1.0
    assert first["cached_tasks"] == 0


def test_second_run_is_served_from_cache(runs):
    _, _, first, second = runs
    assert second["cached_tasks"] == 5 and all(second["cached"].values())
    for key in ("acc_clean", "acc_corrupted", "acc_ttt"):
        assert second[key] == first[key]
    assert second["model_path"] == first["model_path"]


def test_mlflow_run_tree(runs):
    from mlflow.tracking import MlflowClient

    tmp, cfg, first, _ = runs
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    parent = client.get_run(first["mlflow_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.params["finetune.epochs"] == "2"
    assert parent.data.params["model.max_length"] == "48"
    assert parent.data.tags["prefect.flow_run_id"]
    assert parent.data.metrics["acc_clean"] == pytest.approx(first["acc_clean"])
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    by_name = {c.info.run_name: c for c in children}
    assert set(by_name) == {"download", "tokenise", "corrupt", "fine-tune", "evaluate"}
    ev = by_name["evaluate"].data.metrics
    # 3 sets of (tutorial 1 severity + keyboard 2 severities) + clean, each without and with TTT
    for name in ("acc/clean/none", "acc/clean/ttt", "acc/tutorial/1/none", "acc/tutorial/1/ttt",
                 "acc/keyboard/1/none", "acc/keyboard/3/ttt"):
        assert 0.0 <= ev[name] <= 1.0, name
    assert ev["acc_clean"] == pytest.approx(first["acc_clean"])
    ft = by_name["fine-tune"]
    history = client.get_metric_history(ft.info.run_id, "val_acc")
    assert [m.step for m in history] == [1, 2]
    assert {f.path for f in client.list_artifacts(ft.info.run_id)} >= {"model", "history.json"}
    assert {f.path for f in client.list_artifacts(ft.info.run_id, "model")} >= {
        "model/encoder", "model/head.safetensors", "model/tokenizer", "model/labels.json"}
    dl = client.get_run(by_name["download"].info.run_id)
    assert {d.dataset.name for d in dl.inputs.dataset_inputs} == {"reviews-train", "reviews-validation", "reviews-test"}
    rate = by_name["corrupt"].data.metrics["edit_rate/keyboard/3"]
    assert 0.05 < rate < 0.15


def test_cli_json_contract(runs, tiny_bert_dir, tmp_path):
    """Same config from the CLI in a fresh process: every task from cache, JSON summary on the last line."""
    tmp, _, first, _ = runs
    cfg_file = tmp_path / "tiny.yaml"
    cfg_file.write_text(yaml.safe_dump(tiny_config(tmp, tiny_bert_dir, "e2e")))
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    proc = subprocess.run([sys.executable, "-m", "ttt_pipeline.cli", "run", "--config", str(cfg_file),
                           "--set", "finetune.epochs=2", "--json"], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"mlflow_run_id", "acc_clean", "acc_corrupted", "acc_ttt", "cached_tasks", "wall_s"} <= set(summary)
    assert summary["cached_tasks"] == 5
    assert "cached tasks: 5/5   wall time" in proc.stdout  # nothing built, so no note about the input check
    assert summary["acc_clean"] == pytest.approx(first["acc_clean"])
    assert "mlflow ui --backend-store-uri" in proc.stdout
