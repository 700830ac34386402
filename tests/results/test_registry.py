"""Model registry: every run registers a version; `champion` moves only to a strictly better run; the
comparison is logged on the pipeline run either way."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from ttt_pipeline.io import model_registry as registry
from ttt_pipeline.io.tracking import Tracker


@pytest.fixture(scope="module")
def tracker(tmp_path_factory):
    """One store for the module (creating an MLflow sqlite schema takes seconds); one model name per test."""
    tmp = tmp_path_factory.mktemp("registry")
    return Tracker(f"sqlite:///{tmp}/mlflow.db", "registry", str(tmp / "mlruns"))


@pytest.fixture()
def NAME(request) -> str:  # noqa: N802 - reads like the constant it replaces
    return "reviews-" + request.node.name.replace("[", "-").replace("]", "")


def fake_pipeline_run(tracker: Tracker, tmp_path, acc_ttt: float | None, with_model: bool = True) -> str:
    """A pipeline run as the flow leaves it: parent with headline metrics, fine-tune child with `model/`."""
    parent = tracker.start("pipeline")
    if acc_ttt is not None:
        tracker.metrics(parent, {"acc_ttt": acc_ttt, "acc_clean": 0.9})
    child = tracker.start("finetune", tags={"stage": "finetune"}, parent=parent)
    if with_model:
        model = tmp_path / f"model-{parent}"
        (model / "encoder").mkdir(parents=True)
        (model / "encoder" / "config.json").write_text("{}")
        (model / "head.safetensors").write_bytes(b"0")
        (model / "meta.json").write_text("{}")
        (model / "labels.json").write_text('{"0": "neg", "1": "pos"}')
        tracker.artifact(child, model, "model")
    tracker.end(child)
    tracker.end(parent)
    return parent


def champion(client, name: str) -> str:
    return str(client.get_model_version_by_alias(name, registry.CHAMPION).version)


@pytest.mark.parametrize("cand,champ_v,champ_val,promote", [
    (0.5, None, None, True), (0.5, "1", None, True), (0.6, "1", 0.5, True), (0.5, "1", 0.5, False),
    (0.4, "1", 0.5, False), (None, None, None, False)])
def test_decide(cand, champ_v, champ_val, promote):
    assert registry.decide(cand, champ_v, champ_val)[0] is promote


def test_champion_moves_only_to_a_strictly_better_run(tracker, tmp_path, NAME):
    client = tracker.client
    r1 = fake_pipeline_run(tracker, tmp_path, 0.50)
    res1 = registry.register_run(client, r1, NAME, "acc_ttt")
    assert (res1.version, res1.decision, res1.champion_before) == ("1", "promoted", None)
    assert champion(client, NAME) == "1"

    r2 = fake_pipeline_run(tracker, tmp_path, 0.40)  # worse: registered, not promoted
    res2 = registry.register_run(client, r2, NAME, "acc_ttt")
    assert (res2.version, res2.decision, res2.champion_before, res2.champion_after) == ("2", "kept", "1", "1")
    assert res2.champion_before_value == pytest.approx(0.50)  # read from v1's source run (its parent)
    assert champion(client, NAME) == "1"

    r3 = fake_pipeline_run(tracker, tmp_path, 0.50)  # a tie keeps the champion
    assert registry.register_run(client, r3, NAME, "acc_ttt").decision == "kept"

    r4 = fake_pipeline_run(tracker, tmp_path, 0.625)
    res4 = registry.register_run(client, r4, NAME, "acc_ttt")
    assert (res4.version, res4.decision, res4.champion_before, res4.champion_after) == ("4", "promoted", "1", "4")
    assert champion(client, NAME) == "4"
    assert registry.champion_run_id(client, NAME) == r4

    # the comparison is logged on the pipeline runs, promoted or not
    run2 = client.get_run(r2).data
    assert run2.tags["registry.decision"] == "kept"
    assert run2.tags["registry.champion_before"] == "1" and run2.tags["registry.version"] == "2"
    assert run2.metrics["registry.candidate_value"] == pytest.approx(0.40)
    assert run2.metrics["registry.champion_before_value"] == pytest.approx(0.50)
    assert run2.metrics["registry.promoted"] == 0.0
    run4 = client.get_run(r4).data
    assert run4.tags["registry.decision"] == "promoted" and run4.metrics["registry.promoted"] == 1.0
    assert "0.6250 > champion v1 0.5000" in run4.tags["registry.reason"]

    # versions point at the finetune run's model artifact, with the decision on the version
    mv = client.get_model_version(NAME, "4")
    ft = client.get_run(mv.run_id)
    assert ft.data.tags["mlflow.parentRunId"] == r4
    assert mv.source == f"{ft.info.artifact_uri}/model"
    assert mv.tags["decision"] == "promoted" and mv.tags["parent_run_id"] == r4
    assert float(mv.tags["metric.acc_ttt"]) == pytest.approx(0.625)
    assert client.get_model_version(NAME, "2").tags["decision"] == "kept"


def test_registered_source_holds_the_model_files(tracker, tmp_path, NAME):
    import mlflow.artifacts

    r1 = fake_pipeline_run(tracker, tmp_path, 0.5)
    res = registry.register_run(tracker.client, r1, NAME, "acc_ttt")
    local = mlflow.artifacts.download_artifacts(artifact_uri=res.source, dst_path=str(tmp_path / "dl"),
                                                tracking_uri=tracker.uri)
    from pathlib import Path

    assert {p.name for p in Path(local).iterdir()} == {"encoder", "head.safetensors", "meta.json", "labels.json"}


def test_retry_does_not_register_twice(tracker, tmp_path, NAME):
    client = tracker.client
    r1 = fake_pipeline_run(tracker, tmp_path, 0.5)
    registry.register_run(client, r1, NAME, "acc_ttt")
    again = registry.register_run(client, r1, NAME, "acc_ttt")
    assert again.version == "1" and again.decision == "promoted"
    assert len(client.search_model_versions(f"name = '{NAME}'")) == 1


def test_no_model_artifact_is_skipped_and_logged(tracker, tmp_path, NAME):
    r1 = fake_pipeline_run(tracker, tmp_path, 0.5, with_model=False)
    res = registry.register_run(tracker.client, r1, NAME, "acc_ttt")
    assert res.decision == "skipped" and res.version is None
    assert tracker.client.get_run(r1).data.tags["registry.decision"] == "skipped"
    assert registry.current_champion(tracker.client, NAME) is None


def test_candidate_without_the_metric_is_registered_not_promoted(tracker, tmp_path, NAME):
    client = tracker.client
    r1 = fake_pipeline_run(tracker, tmp_path, 0.5)
    registry.register_run(client, r1, NAME, "acc_ttt")
    r2 = fake_pipeline_run(tracker, tmp_path, None)  # e.g. ttt.methods without masked_ttt
    res = registry.register_run(client, r2, NAME, "acc_ttt")
    assert (res.version, res.decision) == ("2", "kept")
    assert champion(client, NAME) == "1"


def test_candidate_value_from_the_flow_wins_over_the_run(tracker, tmp_path, NAME):
    r1 = fake_pipeline_run(tracker, tmp_path, None)
    res = registry.register_run(tracker.client, r1, NAME, "acc_ttt", candidate_value=0.7)
    assert res.decision == "promoted" and res.candidate_value == 0.7


# ----------------------------------------------------------------- the flow, end to end (two tiny runs)


@pytest.mark.slow
def test_flow_registers_both_runs_and_the_better_is_champion(two_runs):
    a, b = two_runs["a"], two_runs["b"]
    client = MlflowClient(two_runs["uri"])
    name = two_runs["cfg_a"].registry.model_name
    assert a["registry"]["version"] == "1" and a["registry"]["decision"] == "promoted"
    assert a["registry"]["alias"] == "champion"
    assert b["registry"]["version"] == "2" and b["registry"]["champion_before"] == "1"
    assert b["registry"]["candidate_value"] == pytest.approx(b["acc_ttt"])
    assert b["registry"]["champion_before_value"] == pytest.approx(a["acc_ttt"])
    better = b if b["acc_ttt"] > a["acc_ttt"] else a  # a tie keeps the first champion
    assert b["registry"]["decision"] == ("promoted" if better is b else "kept")
    assert registry.champion_run_id(client, name) == better["mlflow_run_id"]
    holder = client.get_model_version_by_alias(name, "champion")
    assert str(holder.version) == ("2" if better is b else "1")
    # the version is the MLflow Model the finetune child run logged
    ft = client.get_run(holder.run_id)
    assert ft.data.tags["mlflow.parentRunId"] == better["mlflow_run_id"] and ft.info.run_name == "finetune"
    [output] = ft.outputs.model_outputs
    assert holder.source == client.get_logged_model(output.model_id).artifact_location
    files = {f.path for f in client.list_logged_model_artifacts(output.model_id, "data/model")}
    assert {"data/model/encoder", "data/model/head.safetensors", "data/model/tokenizer", "data/model/meta.json"} <= files
    # the parent runs carry the decision
    tags_b = client.get_run(b["mlflow_run_id"]).data.tags
    assert tags_b["registry.decision"] == b["registry"]["decision"] and tags_b["registry.champion_before"] == "1"


@pytest.mark.slow
def test_flow_logs_plots_on_stage_and_parent_runs(two_runs):
    from ttt_pipeline.io import plots

    client = MlflowClient(two_runs["uri"])
    parent = client.get_run(two_runs["b"]["mlflow_run_id"])
    children = {c.info.run_name: c.info.run_id for c in client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")}
    listed = lambda rid: {f.path.split("/")[-1] for f in client.list_artifacts(rid, "plots")}  # noqa: E731
    assert listed(children["finetune"]) == set(plots.FINETUNE_PLOTS)
    assert listed(children["evaluate"]) == set(plots.EVALUATION_PLOTS)
    assert listed(parent.info.run_id) == set(plots.FINETUNE_PLOTS) | set(plots.EVALUATION_PLOTS)
    assert "sample_predictions.json" in {f.path for f in client.list_artifacts(children["evaluate"])}
    import mlflow.artifacts

    local = mlflow.artifacts.download_artifacts(run_id=parent.info.run_id, artifact_path="plots/training_curves.png",
                                                dst_path=str(two_runs["tmp"] / "dl"), tracking_uri=two_runs["uri"])
    w, h = plots.png_size(local)
    assert w >= 900 and h >= 300  # 3 panels: CE loss, validation scores, joint MLM loss


def test_the_alias_never_moves_to_a_model_with_other_labels(tracker, tmp_path, NAME):
    """Issue 38: the registered model records its label set; a model of another task (a 4-class model under a
    2-class model's name) is refused before a version is created, however good its metric."""
    client = tracker.client
    r1 = fake_pipeline_run(tracker, tmp_path, 0.50)
    first = registry.register_run(client, r1, NAME, "acc_ttt", labels=["neg", "pos"])
    assert first.promoted and first.labels == ["neg", "pos"]
    assert client.get_registered_model(NAME).tags["labels"] == '["neg", "pos"]'
    assert client.get_model_version(NAME, "1").tags["labels"] == '["neg", "pos"]'
    r2 = fake_pipeline_run(tracker, tmp_path, 0.99)
    with pytest.raises(registry.LabelMismatch, match=r"holds models for the labels \['neg', 'pos'\]; this run's "
                       r"model predicts \['1', '2', '4', '5'\]"):
        registry.register_run(client, r2, NAME, "acc_ttt", labels=["1", "2", "4", "5"])
    assert champion(client, NAME) == "1" and len(client.search_model_versions(f"name = '{NAME}'")) == 1
    r3 = fake_pipeline_run(tracker, tmp_path, 0.60)
    assert registry.register_run(client, r3, NAME, "acc_ttt", labels=["neg", "pos"]).promoted  # same task: judged
