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

    from ttt_pipeline.model import build_classifier, save_model
    from ttt_pipeline.tracking import Tracker

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
    source = f"{client.get_run(run_id).info.artifact_uri}/model"  # as ttt_pipeline.registry registers it
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

    # a previous night that scored far higher: tonight's run must fail, flagged everywhere
    from ttt_pipeline.tracking import Tracker

    tracker = Tracker.from_config(cfg.tracking)
    fake = tracker.start("nightly-2030-01-03", tags={"ttt_run_kind": "nightly-reevaluation", "night": "2030-01-03",
                                                     "registered_model": NAME})
    tracker.metrics(fake, {"robust_acc_ref": second["robust_acc_ref"] + 0.5})
    tracker.end(fake)
    state, arts = _run(cfg, threshold=0.05, reference_seed=7, night="2030-01-04")
    assert state.is_failed()
    assert "fell from" in state.message or "RobustnessRegression" in (state.message or "")
    flagged = [a for a in arts if "REGRESSION" in (a.data or "")]
    assert flagged and "REGRESSION" in (flagged[-1].description or "")
    runs = client.search_runs([run.info.experiment_id], "tags.night = '2030-01-04'")
    assert len(runs) == 1 and runs[0].info.status == "FAILED" and runs[0].data.tags["regression"] == "true"
    assert runs[0].data.tags["previous_run_id"] == fake
    results = json.loads(open(client.download_artifacts(runs[0].info.run_id, "nightly_results.json",
                                                        str(tmp))).read())
    assert {r["kind"] for r in results["night"]} >= {"clean", "corrupted"}
    assert {r["kind"] for r in results["ref"]} == {"corrupted"}


def test_missing_champion_is_a_clear_error(setup, tmp_path):
    from flows.reevaluate import load_champion
    from ttt_pipeline.errors import PipelineError

    _, _, client, _ = setup
    with pytest.raises(PipelineError, match="no version at alias 'champion'"):
        load_champion(client, "no-such-model")
