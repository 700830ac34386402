"""nightly-reevaluation in-process: champion from the MLflow registry, two suites, comparison, loud failure; the
judged method is the recommended defense (evaluation.default_defense: masked_ttt here, the tiny config scores it)."""

from __future__ import annotations

import datetime
import json
import time

import pytest
from tiny_config import tiny_config

from ttt_pipeline.config import PipelineConfig

pytestmark = pytest.mark.slow
NAME = "ops-tiny-classifier"


def iso_date(year: int, month: int, day: int) -> str:
    """A night as the flow and the CLI take it (YYYY-MM-DD)."""
    return datetime.date(year, month, day).isoformat()


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_bert_dir):
    """A registered tiny classifier (untrained head: scoring is what is tested) at alias `champion`."""
    from mlflow.tracking import MlflowClient

    from ttt_pipeline.io.tracking import Tracker
    from ttt_pipeline.modeling.model import build_classifier, save_model

    tmp = tmp_path_factory.mktemp("nightly")
    cfg = PipelineConfig.model_validate(tiny_config(tmp, tiny_bert_dir, suite="ops"))
    cfg.registry.model_name = NAME
    cfg.evaluation.default_defense = "masked_ttt"
    model, tok = build_classifier(cfg.model, cfg.data.label_names)
    save_model(model, tok, tmp / "model")
    tracker = Tracker.from_config(cfg.tracking)
    run_id = tracker.start("finetune")
    tracker.artifact(run_id, tmp / "model", "model")
    tracker.end(run_id)
    client = MlflowClient(cfg.tracking.tracking_uri)
    client.create_registered_model(NAME)
    source = f"{client.get_run(run_id).info.artifact_uri}/model"  # as ttt_pipeline.io.model_registry registers it
    mv = client.create_model_version(NAME, source, run_id=run_id)
    client.set_registered_model_alias(NAME, "champion", mv.version)
    return tmp, cfg, client, mv


@pytest.fixture(scope="module")
def harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def _run(cfg, **kw):
    from ttt_pipeline.flows.reevaluate import nightly_reevaluation

    state = nightly_reevaluation(config=cfg, return_state=True, **kw)
    return state, _artifacts()


def _events(name: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter

    for _ in range(30):  # events are sent in the background: wait until the server has them
        with get_client(sync_client=True) as c:
            got = c.read_events(EventFilter(event=EventNameFilter(name=[name])), limit=50).events
        if got:
            return got
        time.sleep(1)
    return []


def _artifacts():
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as c:
        return c.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["nightly-reevaluation"])))


def test_nightly_passes_then_fails_loudly_on_a_drop(setup, harness):
    tmp, cfg, client, mv = setup
    state, arts = _run(cfg, threshold=0.05, reference_seed=7, night=iso_date(2030, 1, 1))
    assert state.is_completed(), state.message
    first = state.result()
    assert first["model_version"] == str(mv.version) and first["previous_run_id"] is None
    assert first["night_seed"] == 20300101 and first["regression"] is False
    assert state.name == "Completed" and first["verdict"] == "ok" and first["defense"] == "masked_ttt"
    assert first["event"]["name"] == "ttt.nightly.ok" and first["event"]["id"]
    # the alarm's power for the 16 reference reviews at threshold 0.05 (ttt_pipeline.evaluation.stats)
    assert first["reference_n"] == 16 and first["min_detectable_drop"] == pytest.approx(0.3919, abs=1e-3)
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
    state, _ = _run(cfg, threshold=0.05, reference_seed=7, night=iso_date(2030, 1, 2))
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
    state, _ = _run(_nights_config(cfg, 0), threshold=0.02, reference_seed=7, night=iso_date(2029, 6, 1))
    assert state.is_completed(), state.message
    # same model, other mask seeds: the point value may move, the paired interval says it is noise
    state, arts = _run(_nights_config(cfg, 5), threshold=0.02, reference_seed=7, night=iso_date(2029, 6, 2))
    assert state.is_completed(), state.message
    quiet = state.result()
    assert quiet["regression"] is False and quiet["robust_acc_change_ci_high"] >= -0.02
    assert quiet["robust_acc_change_ci_low"] <= quiet["robust_acc_change"] <= quiet["robust_acc_change_ci_high"]
    assert "it does not." in [a for a in arts if iso_date(2029, 6, 2) in (a.data or "")][-1].data

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
    before = iso_date(2029, 6, 3)
    fake = tracker.start(f"nightly-{before}", tags={"ttt_run_kind": "nightly-reevaluation", "night": before,
                                                    "registered_model": NAME})
    tracker.metrics(fake, {"robust_acc_ref": quiet["robust_acc_ref"] + 0.1})
    tracker.artifact(fake, tmp_path / "predictions_ref.parquet")
    tracker.end(fake)

    state, arts = _run(_nights_config(cfg, 5), threshold=0.02, reference_seed=7, night=iso_date(2029, 6, 4))
    assert state.is_failed() and state.name == "Regression"  # a named outcome, not a crash
    out = state.result(raise_on_failure=False)
    assert out["verdict"] == "regression" and out["event"]["name"] == "ttt.nightly.regression"
    assert out["reference"]["ci_high"] < -0.02 and f"previous night {before}" in out["reference"]["against"]
    events = _events("ttt.nightly.regression")
    assert [e for e in events if str(e.id) == out["event"]["id"]][0].payload["reference"]["delta"] == \
        pytest.approx(out["reference"]["delta"])
    assert "95% paired interval" in state.message and "lies below -2.00" in state.message
    flagged = [a for a in arts if "REGRESSION" in (a.data or "")]
    assert flagged and "REGRESSION" in (flagged[-1].description or "") and "it does." in flagged[-1].data
    runs = client.search_runs([client.get_run(quiet["mlflow_run_id"]).info.experiment_id],
                              f"tags.night = '{iso_date(2029, 6, 4)}'")
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
    from ttt_pipeline.errors import PipelineError
    from ttt_pipeline.io.nights import load_champion

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
    state, arts = _run(lonely, night=iso_date(2030, 2, 1))
    assert state.is_failed() and state.name == "NoChampion"
    out = state.result(raise_on_failure=False)
    assert out["verdict"] == "no_champion" and out["event"]["name"] == "ttt.nightly.no-champion"
    assert any(str(e.id) == out["event"]["id"] for e in _events("ttt.nightly.no-champion"))
    assert "'never-registered' has no version at alias 'champion'" in state.message
    fr, _ = _flow_run(state)
    assert fr.run_count == 1  # not retried
    notes = [a for a in arts if "No champion yet" in (a.data or "")]
    assert notes and "NO CHAMPION" in notes[-1].description
    assert "Run the ttt-pipeline deployment once" in notes[-1].data and iso_date(2030, 2, 1) in notes[-1].data


def test_an_error_in_the_data_fails_the_night_at_once_without_retries(setup, harness):
    """The download task retries remote-source failures only: a wrong column fails the same way every time."""
    _, cfg, _, _ = setup
    wrong = cfg.model_copy(deep=True)
    wrong.data.label_column = "stars"
    state, _ = _run(wrong, night=iso_date(2030, 2, 2))
    assert state.is_failed() and "['stars'] not found" in state.message
    _, tasks = _flow_run(state)
    (download,) = [t for t in tasks if t.name.startswith("download")]
    assert download.state.is_failed() and download.run_count == 1


KITCHEN = ["The blender crushed ice in seconds and the jar washes clean", "This skillet warped after one week on gas",
           "Knives arrived dull and the block cracked", "Great kettle, boils fast and the handle stays cool",
           "The toaster burns one side of every slice", "Sturdy pots, even heating, lids fit snugly",
           "Nonstick coating flaked into the omelette", "Lovely mixing bowls, nest neatly in the cupboard"]


def _new_reviews(folder) -> None:
    """Two exports of kitchen reviews (another domain than the demo's electronics); the newer one is read."""
    folder.mkdir()
    old = folder / f"{iso_date(2030, 1, 1)}.jsonl"
    old.write_text(json.dumps({"text": "old export", "rating": 5}) + "\n")
    rows = [{"text": f"{t}.", "rating": 5 if i % 2 else 1} for i, t in enumerate(KITCHEN * 3)]
    new = folder / f"{iso_date(2030, 1, 2)}.jsonl"
    new.write_text("".join(json.dumps(r) + "\n" for r in rows))
    import os

    os.utime(old, (1_000_000, 1_000_000))


def test_new_reviews_are_scored_with_the_defense_against_the_test_accuracy_with_drift(setup, harness, tmp_path,
                                                                                         capsys):
    """nightly.data_path (a folder: its newest file): the change against the test accuracy with its Newcombe
    interval and the drift figures, through `ttt-pipeline reevaluate --json` (the same flow)."""
    import yaml

    from ttt_pipeline.cli.main import main

    _, cfg, _, _ = setup
    _new_reviews(tmp_path / "drop")
    c = cfg.model_dump(mode="json")
    c["nightly"] = {"data_path": str(tmp_path / "drop")}
    (tmp_path / "night.yaml").write_text(yaml.safe_dump(c))
    code = main(["reevaluate", "--config", str(tmp_path / "night.yaml"), "--night", iso_date(2030, 3, 1), "--json"])
    out = capsys.readouterr().out
    s = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and s["verdict"] == "ok" and s["defense"] == "masked_ttt"
    new = s["new_data"]
    assert new["n"] == 24 and new["source"].endswith(f"{iso_date(2030, 1, 2)}.jsonl")
    assert new["delta"] == pytest.approx(new["acc"] - new["acc_reference"])
    assert new["ci_low"] <= new["delta"] <= new["ci_high"] and new["with_defense"]["n_reference"] == 16
    d = new["drift"]
    assert d["label_shares"]["new"] == {"1": 0.5, "2": 0.0, "3": 0.0, "4": 0.0, "5": 0.5}
    assert d["mean_words"]["new"] == pytest.approx(sum(len(t.split()) for t in KITCHEN) / 8)
    assert d["unseen_word_share"]["new"] > d["unseen_word_share"]["test"]  # kitchen words the training never saw
    assert "new data (24 reviews)" in out and "alarm power: 16 reviews" in out
    assert set(s) >= {"defense", "verdict", "reference", "new_data", "min_detectable_drop", "event"}


def test_reevaluate_without_a_champion_exits_non_zero_with_a_clear_message(setup, harness, tmp_path, capsys):
    import yaml

    from ttt_pipeline.cli.main import main

    _, cfg, _, _ = setup
    c = cfg.model_dump(mode="json")
    c["registry"]["model_name"] = "empty-registry"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(c))
    code = main(["reevaluate", "--config", str(tmp_path / "c.yaml"), "--night", iso_date(2030, 3, 2), "--json"])
    cap = capsys.readouterr()
    s = json.loads(cap.out.strip().splitlines()[-1])
    assert code == 2 and s["verdict"] == "no_champion" and s["event"]["name"] == "ttt.nightly.no-champion"
    assert "error: registered model 'empty-registry' has no version at alias 'champion'" in cap.err
    assert "hint: run the ttt-pipeline deployment once" in cap.err


def test_training_predictions_read_the_champions_pipeline_run(monkeypatch):
    """The paired baseline of a first night: the predictions of the pipeline run above the champion's run
    (its `parent_run_id` tag, else the run's MLflow parent). Errors there are swallowed by design (a deleted run
    has no baseline), so this pins the lookups themselves."""
    from types import SimpleNamespace

    from ttt_pipeline.io import nights as reevaluate

    calls = []

    class Client:
        def get_run(self, run_id):
            calls.append(run_id)
            return SimpleNamespace(info=SimpleNamespace(run_id=run_id),
                                   data=SimpleNamespace(tags={"mlflow.parentRunId": "pipeline-1"}))

    monkeypatch.setattr("ttt_pipeline.io.runs.run_predictions", lambda client, run: ("predictions", run.info.run_id))
    tracker = SimpleNamespace(client=Client())
    assert reevaluate.training_predictions(tracker, SimpleNamespace(tags={}, run_id="finetune-1")) == (
        "predictions", "pipeline-1")
    assert calls == ["finetune-1", "pipeline-1"]
    tagged = SimpleNamespace(tags={"parent_run_id": "pipeline-2"}, run_id="finetune-2")
    assert reevaluate.training_predictions(tracker, tagged) == ("predictions", "pipeline-2")
