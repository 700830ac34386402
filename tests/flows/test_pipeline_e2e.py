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
from ttt_pipeline.evaluation.stats import format_difference
from ttt_pipeline.reports.run import difference_line

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_bert_dir):
    from prefect.testing.utilities import prefect_test_harness

    from ttt_pipeline.flows.pipeline import ttt_pipeline

    tmp = tmp_path_factory.mktemp("e2e")
    cfg = PipelineConfig.model_validate(_config(tmp, tiny_bert_dir))
    with prefect_test_harness(server_startup_timeout=120):
        first = ttt_pipeline(config=cfg)
        second = ttt_pipeline(config=cfg)
        grid = _artifact_table("evaluation-grid")
    return tmp, cfg, first, second, grid


def _config(tmp, model_dir) -> dict:
    return tiny_config(tmp, model_dir, "e2e", ttt={"mask_seeds": 2})


def _artifact_table(key: str) -> list[dict]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as c:
        arts = c.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    data = arts[-1].data
    return json.loads(data) if isinstance(data, str) else data


def test_first_run_scores_every_set(runs):
    _, _, first, _, _ = runs
    for key in ("acc_clean", "acc_corrupted", "acc_ttt", "acc_clean_ttt"):
        assert 0.0 <= first[key] <= 1.0
    assert first["cached_tasks"] == 0
    # issue 35: the signal TTT adapts on, in every run (a random tiny head: near-uniform over 30k tokens)
    assert 1000 < first["mlm_perplexity_clean"] < 1e6 and 0.0 <= first["mlm_top1_clean"] <= 1.0
    assert first["mlm_perplexity_corrupted"] > 1000
    assert first["ttt_heldout_change"] == pytest.approx(first["ttt_heldout_after"] - first["ttt_heldout_before"])
    assert 0.0 <= first["ttt_changed_share"] <= 1.0


def test_second_run_is_served_from_cache(runs):
    _, _, first, second, _ = runs
    assert second["cached_tasks"] == 5 and all(second["cached"].values())
    for key in ("acc_clean", "acc_corrupted", "acc_ttt"):
        assert second[key] == first[key]
    assert second["model_path"] == first["model_path"]


def test_mlflow_run_tree(runs):
    from mlflow.tracking import MlflowClient

    tmp, cfg, first, _, _ = runs
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
    assert set(by_name) == {"download", "tokenise", "corrupt", "finetune", "evaluate"}
    ev = by_name["evaluate"].data.metrics
    # 3 sets of (tutorial 1 severity + keyboard 2 severities) + clean, each without and with TTT
    for name in ("acc/clean/none", "acc/clean/ttt", "acc/tutorial/1/none", "acc/tutorial/1/ttt",
                 "acc/keyboard/1/none", "acc/keyboard/3/ttt"):
        assert 0.0 <= ev[name] <= 1.0, name
    assert ev["acc_clean"] == pytest.approx(first["acc_clean"])
    ft = by_name["finetune"]
    history = client.get_metric_history(ft.info.run_id, "val_acc")
    assert [m.step for m in history] == [1, 2]
    assert "history.json" in {f.path for f in client.list_artifacts(ft.info.run_id)}
    [output] = client.get_run(ft.info.run_id).outputs.model_outputs  # the classifier as an MLflow Model
    logged = client.get_logged_model(output.model_id)
    assert logged.source_run_id == ft.info.run_id and str(logged.status) == "READY"
    assert {f.path for f in client.list_logged_model_artifacts(output.model_id, "data/model")} >= {
        "data/model/encoder", "data/model/head.safetensors", "data/model/tokenizer", "data/model/labels.json",
        "data/model/vocabulary.json"}
    dl = client.get_run(by_name["download"].info.run_id)
    assert {d.dataset.name for d in dl.inputs.dataset_inputs} == {"reviews-train", "reviews-validation", "reviews-test"}
    rate = by_name["corrupt"].data.metrics["edit_rate/keyboard/3"]
    assert 0.05 < rate < 0.15


def test_cli_json_contract(runs, tiny_bert_dir, tmp_path):
    """Same config from the CLI in a fresh process: every task from cache, JSON summary on the last line."""
    tmp, _, first, _, _ = runs
    cfg_file = tmp_path / "tiny.yaml"
    cfg_file.write_text(yaml.safe_dump(_config(tmp, tiny_bert_dir)))
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    proc = subprocess.run([sys.executable, "-m", "ttt_pipeline.cli.main", "run", "--config", str(cfg_file),
                           "--set", "finetune.epochs=2", "--json"], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"mlflow_run_id", "acc_clean", "acc_corrupted", "acc_ttt", "cached_tasks", "wall_s"} <= set(summary)
    assert summary["cached_tasks"] == 5
    # issue 38: the recommended defense (none: the tiny config recommends none) and the task's registered model
    assert summary["default_defense"] == "none" and first["default_defense"] == "none"
    champ = summary["champion"]
    assert champ["model_name"] == "ttt-demo-reviews-1-2-3-4-5" and champ["metric"] == "acc_corrupted"
    assert champ["value"] == pytest.approx(summary["acc_corrupted"]) and champ["alias_moved"] is False  # a tie
    assert first["champion"]["alias_moved"] is True and first["champion"]["model_name"] == champ["model_name"]
    assert "cached tasks: 5/5   wall time" in proc.stdout  # nothing built, so no note about the input check
    assert summary["acc_clean"] == pytest.approx(first["acc_clean"])
    assert "mlflow ui --backend-store-uri" in proc.stdout
    # the TTT gain with its interval and verdict, pooled over the 2 mask seeds, as the flow computed it
    assert summary["ttt_gain"] == first["ttt_gain"]
    assert "pooled over 2 mask seeds" in proc.stdout
    assert "MLM head: perplexity " in proc.stdout and "masked TTT: held-out MLM loss " in proc.stdout
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("corrupted, masked_ttt")]
    assert line and line[0].endswith(format_difference(first["ttt_gain"]))
    # the terminal names every stage, cached or computed; Prefect's per-task lifecycle lines are gone
    for stage in ("download", "tokenise", "corrupt", "finetune", "evaluate"):
        assert f"{stage}: cached (served from the store) in " in proc.stderr, proc.stderr[-3000:]
    assert "Finished in state Completed()" not in proc.stderr


def test_statistics_recomputed_from_stored_predictions(runs):
    """The gain the run reports, its MLflow metrics, `report` and the Prefect grid all agree with what the
    stored per-review predictions give when recomputed after the fact."""
    import pandas as pd
    from mlflow.tracking import MlflowClient

    from ttt_pipeline.evaluation import robustness
    from ttt_pipeline.io.runs import format_report, run_summary

    tmp, cfg, first, _, grid = runs
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    parent = client.get_run(first["mlflow_run_id"])
    ev = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}' and "
                            "attributes.run_name = 'evaluate'")[0]
    preds = pd.read_parquet(client.download_artifacts(ev.info.run_id, "predictions.parquet", str(tmp)))
    corrupted = list(dict.fromkeys(preds.loc[preds["kind"] == "corrupted", "set"]))
    assert sorted(preds["mask_seed"].dropna().unique()) == [0, 1] and len(corrupted) == 3
    assert len(preds[(preds["set"] == "clean") & (preds["method"] == "none")]) == 24
    again = robustness.compare_methods(preds, corrupted, "masked_ttt", resamples=2000, seed=0).to_dict()
    gain = first["ttt_gain"]
    assert gain["mask_seeds"] == [0, 1]
    for k in ("delta", "ci_low", "ci_high", "p_mcnemar", "helped", "hurt", "significant"):
        assert gain[k] == pytest.approx(again[k]), k
        assert parent.data.metrics[f"ttt_gain_{k}" if k != "delta" else "ttt_gain"] == pytest.approx(float(again[k]))
    assert gain["significant"] == (gain["ci_low"] > 0 or gain["ci_high"] < 0)
    assert gain["macro_f1_delta"] is not None  # (the tiny model predicts one class: the numbers are in tests/evaluation)
    drop = first["corruption_drop"]
    assert drop["delta"] == pytest.approx(first["acc_clean"] - first["acc_corrupted"])
    text = format_report(run_summary(parent, client))
    assert "  ".join(difference_line(gain)) in text and "corruption drop" in text
    row = [r for r in grid if r["set"] == "keyboard-3" and r["method"] == "masked_ttt"][0]
    per_set = robustness.compare_methods(preds, ["keyboard-3"], "masked_ttt", resamples=2000, seed=0)
    assert row["vs_none"] == pytest.approx(round(per_set.delta, 4)) and row["mask_seeds"] == 2
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((round(per_set.ci_low, 4), round(per_set.ci_high, 4)))
    assert row["verdict"] in ("significant", "not significant")


def test_attribution_off_adds_nothing(runs):
    """attribution.enabled is off by default: no attribute task, store entry or child run (the enabled flow is
    tests/attribution/test_flow.py); the run-tree test above checks the five child runs."""
    _, cfg, first, second, _ = runs
    assert cfg.attribution.enabled is False
    assert set(first["cached"]) == set(second["cached"]) == {"download", "tokenise", "corrupt", "finetune", "evaluate"}
    assert not (Path(cfg.store) / "attribute").exists()
