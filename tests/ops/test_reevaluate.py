"""nightly-reevaluation in-process: champion from the MLflow registry, two suites, comparison, loud failure."""

from __future__ import annotations

import json

import pytest
from _ops_config import tiny_config

from ttt_pipeline.config import PipelineConfig

pytestmark = pytest.mark.slow
NAME = "ops-tiny-classifier"


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_bert_dir):
    """A registered tiny classifier (untrained head: scoring is what is tested) at alias `champion`."""
    from mlflow.tracking import MlflowClient

    from ttt_pipeline.io.tracking import Tracker
    from ttt_pipeline.modeling.model import build_classifier, save_model

    tmp = tmp_path_factory.mktemp("nightly")
    cfg = PipelineConfig.model_validate(tiny_config(tmp, tiny_bert_dir))
    cfg.registry.model_name = NAME
    model, tok = build_classifier(cfg.model, cfg.data.label_names)
    save_model(model, tok, tmp / "model")
    tracker = Tracker.from_config(cfg.tracking)
    run_id = tracker.start("fine-tune")
    tracker.artifact(run_id, tmp / "model", "model")
    tracker.end(run_id)
    client = MlflowClient(cfg.tracking.tracking_uri)
    client.create_registered_model(NAME)
    source = f"{client.get_run(run_id).info.artifact_uri}/model"  # as ttt_pipeline.io.registry registers it
    mv = client.create_model_version(NAME, source, run_id=run_id)
    client.set_registered_model_alias(NAME, "champion", mv.version)
    return tmp, cfg, client, mv


@pytest.fixture(scope="module")
def harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def _run(cfg, **kw):
    from flows.reevaluate import nightly_reevaluation

    state = nightly_reevaluation(config=cfg, return_state=True, **kw)
    return state, _artifacts()


def _artifacts():
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as c:
        return c.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["nightly-reevaluation"])))


def test_nightly_passes_then_fails_loudly_on_a_drop(setup, harness):
    tmp, cfg, client, mv = setup
    state, arts = _run(cfg, threshold=0.05, reference_seed=7, night="2030-01-01")
    assert state.is_completed(), state.message
    first = state.result()
    assert first["model_version"] == str(mv.version) and first["previous_run_id"] is None
    assert first["night_seed"] == 20300101 and first["regression"] is False
    run = client.get_run(first["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["model_version"] == str(mv.version) and run.data.tags["registered_model"] == NAME
    assert run.data.tags["model_source_run_id"] == mv.run_id
    for k in ("robust_acc_ref", "robust_acc_night", "acc_corrupted_ref", "acc_clean"):
        assert 0.0 <= run.data.metrics[k] <= 1.0, k
    assert run.data.params["night_seed"] == "20300101" and run.data.params["reference_seed"] == "7"
    assert client.get_model_version(NAME, mv.version).tags["nightly.last_run_id"] == first["mlflow_run_id"]
    assert any("no regression" in (a.data or "") for a in arts)

    # the next night: same model, same reference suite -> no drop; a different nightly suite
    state, _ = _run(cfg, threshold=0.05, reference_seed=7, night="2030-01-02")
    assert state.is_completed(), state.message
    second = state.result()
    assert second["previous_run_id"] == first["mlflow_run_id"]
    assert second["robust_acc_drop"] == pytest.approx(0.0)
    assert second["night_seed"] != first["night_seed"]

    # the previous night stored its reference predictions: tonight's change is paired, with an interval
    assert second["robust_acc_change"] == pytest.approx(0.0)
    assert second["robust_acc_change_ci_low"] <= 0.0 <= second["robust_acc_change_ci_high"]


def _nights_config(cfg, seed: int):
    """The whole demo test split (98 reviews: a 10-point change is measurable), masked TTT with 2 mask seeds."""
    c = cfg.model_copy(deep=True)
    c.data.max_test_samples = None
    c.ttt.seed, c.ttt.mask_seeds = seed, 2
    return c


def test_alarm_is_paired_silent_on_a_new_mask_seed_loud_on_a_real_regression(setup, harness, tmp_path):
    import pandas as pd

    from ttt_pipeline.io.tracking import Tracker

    tmp, cfg, client, mv = setup
    state, _ = _run(_nights_config(cfg, 0), threshold=0.02, reference_seed=7, night="2029-06-01")
    assert state.is_completed(), state.message
    # same model, other mask seeds: the point value may move, the paired interval says it is noise
    state, arts = _run(_nights_config(cfg, 5), threshold=0.02, reference_seed=7, night="2029-06-02")
    assert state.is_completed(), state.message
    quiet = state.result()
    assert quiet["regression"] is False and quiet["robust_acc_change_ci_high"] >= -0.02
    assert quiet["robust_acc_change_ci_low"] <= quiet["robust_acc_change"] <= quiet["robust_acc_change_ci_high"]
    assert "it does not." in [a for a in arts if "2029-06-02" in (a.data or "")][-1].data

    # a previous night that was right on 10 more reviews in 100 (same reviews, same mask seeds)
    tracker = Tracker.from_config(cfg.tracking)
    ref = pd.read_parquet(client.download_artifacts(quiet["mlflow_run_id"], "predictions_ref.parquet", str(tmp_path)))
    n = ref["index"].nunique()
    ttt = ref["method"] == "masked_ttt"
    wrong = sorted(set(ref.loc[ttt & (ref["pred"] != ref["label"]), "index"]))
    assert len(wrong) >= n // 10, "the untrained head must be wrong often enough to build the regression"
    better = ref.copy()
    fix = ttt & better["index"].isin(wrong[: round(0.1 * n)])
    better.loc[fix, "pred"] = better.loc[fix, "label"]
    better.to_parquet(tmp_path / "predictions_ref.parquet", index=False)
    fake = tracker.start("nightly-2029-06-03", tags={"ttt_run_kind": "nightly-reevaluation", "night": "2029-06-03",
                                                     "registered_model": NAME})
    tracker.metrics(fake, {"robust_acc_ref": quiet["robust_acc_ref"] + 0.1})
    tracker.artifact(fake, tmp_path / "predictions_ref.parquet")
    tracker.end(fake)

    state, arts = _run(_nights_config(cfg, 5), threshold=0.02, reference_seed=7, night="2029-06-04")
    assert state.is_failed()
    assert "95% paired interval" in state.message and "lies below -2.00" in state.message
    flagged = [a for a in arts if "REGRESSION" in (a.data or "")]
    assert flagged and "REGRESSION" in (flagged[-1].description or "") and "it does." in flagged[-1].data
    runs = client.search_runs([client.get_run(quiet["mlflow_run_id"]).info.experiment_id], "tags.night = '2029-06-04'")
    assert len(runs) == 1 and runs[0].info.status == "FAILED" and runs[0].data.tags["regression"] == "true"
    assert runs[0].data.tags["previous_run_id"] == fake
    m = runs[0].data.metrics
    fixed = int(fix.sum() / 2)  # reviews, over the 2 mask seeds
    assert m["robust_acc_change"] == pytest.approx(-fixed / n) and m["robust_acc_change_ci_high"] < -0.02
    results = json.loads(open(client.download_artifacts(runs[0].info.run_id, "nightly_results.json",
                                                        str(tmp_path))).read())
    assert {r["kind"] for r in results["night"]} >= {"clean", "corrupted"}
    assert {r["kind"] for r in results["ref"]} == {"corrupted"}


def test_missing_champion_is_a_clear_error(setup, tmp_path):
    from flows.reevaluate import load_champion
    from ttt_pipeline.errors import PipelineError

    _, _, client, _ = setup
    with pytest.raises(PipelineError, match="no version at alias 'champion'"):
        load_champion(client, "no-such-model")


def _flow_run(state):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as c:
        fr = c.read_flow_run(state.state_details.flow_run_id)
        tasks = c.read_task_runs()
    return fr, [t for t in tasks if t.flow_run_id == fr.id]


def test_no_champion_fails_once_and_the_artifact_says_what_to_do(setup, harness):
    _, cfg, _, _ = setup
    lonely = cfg.model_copy(deep=True)
    lonely.registry.model_name = "never-registered"
    state, arts = _run(lonely, night="2030-02-01")
    assert state.is_failed()
    assert "'never-registered' has no version at alias 'champion'" in state.message
    fr, _ = _flow_run(state)
    assert fr.run_count == 1  # not retried
    notes = [a for a in arts if "No champion yet" in (a.data or "")]
    assert notes and "NO CHAMPION" in notes[-1].description
    assert "Run the ttt-pipeline deployment once" in notes[-1].data and "2030-02-01" in notes[-1].data


def test_an_error_in_the_data_fails_the_night_at_once_without_retries(setup, harness):
    """The download task retries remote-source failures only: a wrong column fails the same way every time."""
    _, cfg, _, _ = setup
    wrong = cfg.model_copy(deep=True)
    wrong.data.label_column = "stars"
    state, _ = _run(wrong, night="2030-02-02")
    assert state.is_failed() and "['stars'] not found" in state.message
    _, tasks = _flow_run(state)
    (download,) = [t for t in tasks if t.name.startswith("download")]
    assert download.state.is_failed() and download.run_count == 1
