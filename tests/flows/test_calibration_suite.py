"""The forecast's own calibration suite: a run whose corrupted sets are too few to calibrate on (the demo's one
keyboard set) scores monitoring.calibration_families under none and the default defense for the calibrate step
alone, and its reported figures stay those of its own sets.

The demo-like tiny pipeline (a random 2-layer BERT, 40 demo reviews, 16 test reviews, keyboard typos at one
severity, `spell` the default defense) runs in this process without Prefect; the slow test runs the flow."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from tiny_config import tiny_config

from ttt_pipeline import steps
from ttt_pipeline.config import PipelineConfig, load_config
from ttt_pipeline.errors import ConfigError
from ttt_pipeline.evaluation.forecast import Calibration
from ttt_pipeline.storage import StepOutput, StepStore

SUITE_SETS = ["keyboard-1", "keyboard-3", "keyboard-5", "misspelling-1", "misspelling-3", "misspelling-5",
              "char_swap-1", "char_swap-3", "char_swap-5", "ocr-1", "ocr-3", "ocr-5", "tutorial-1"]


def _demo_like(tmp: Path, model_dir: Path, **monitoring) -> dict:
    return tiny_config(tmp, model_dir, suite="ops", corruption={"families": ["keyboard"], "severities": [4]},
                       ttt={"methods": ["none", "spell"], "batch_size": 8, "score_clean": False},
                       evaluation={"default_defense": "spell", "signal_reviews": 0}, monitoring=monitoring)


def _corrupted(*sets: str) -> StepOutput:
    meta = {s: {"family": s.rsplit("-", 1)[0], "severity": int(s.rsplit("-", 1)[1])} for s in sets}
    return StepOutput(step="corrupt", key="k", path="/nowhere", digest="d", meta={"sets": meta})


def test_the_demo_gets_the_default_suite_with_everything_else_its_own():
    demo = load_config("demo")
    suite = steps.calibration_suite(demo, _corrupted("keyboard-4"))
    assert suite.corruption.model_dump() == {"families": ["keyboard", "misspelling", "char_swap", "ocr", "tutorial"],
                                             "severities": [1, 3, 5], "seed": demo.corruption.seed}
    assert suite.ttt.methods == ["none", "spell"] and suite.ttt.seeds() == [demo.ttt.seed]
    assert suite.evaluation.signal_reviews == 0 and suite.evaluation.default_defense == "spell"
    for section in ("data", "model", "finetune", "tracking", "registry", "store", "monitoring"):
        assert getattr(suite, section) == getattr(demo, section), section
    same_ttt = {k for k in type(demo.ttt).model_fields if k not in ("methods", "mask_seeds")}
    assert {k: getattr(suite.ttt, k) for k in same_ttt} == {k: getattr(demo.ttt, k) for k in same_ttt}


@pytest.mark.parametrize("sets, updates, why", [
    (["keyboard-1", "keyboard-3", "ocr-1", "ocr-3", "tutorial-1", "case-1"], {}, "two families and six sets suffice"),
    (["keyboard-4"], {"evaluation.default_defense": None}, "no repair: nothing to calibrate"),
    (["keyboard-4"], {"evaluation.default_defense": "mask_ensemble"}, "no repair: nothing to calibrate"),
    (["keyboard-4"], {"monitoring.calibration_families": []}, "the suite turned off"),
])
def test_no_suite_where_the_runs_own_sets_suffice_or_nothing_would_be_calibrated(sets, updates, why):
    cfg = load_config("demo", ["ttt.methods=[none, spell, mask_ensemble]"], updates)
    assert steps.calibration_suite(cfg, _corrupted(*sets)) is None, why


def test_five_sets_of_two_families_are_too_few():
    suite = steps.calibration_suite(load_config("demo"), _corrupted("keyboard-1", "keyboard-3", "ocr-1", "ocr-3",
                                                                    "tutorial-1"))
    assert suite is not None and len(suite.corruption.families) == 5


@pytest.mark.parametrize("value, words", [
    ("[keyboard]", "one family (keyboard) cannot calibrate the forecast"),
    ("[keyboard, typo]", "unknown families ['typo']"),
])
def test_a_calibration_suite_of_one_family_or_an_unknown_one_stops_at_the_edge(value, words):
    with pytest.raises(ConfigError) as err:
        load_config("demo", [f"monitoring.calibration_families={value}"])
    assert words in f"{err.value.message} {err.value.hint}"
    with pytest.raises(ConfigError, match="severities must be in 1..5"):
        load_config("demo", ["monitoring.calibration_severities=[0, 3]"])


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_bert_dir) -> SimpleNamespace:
    """The demo-like pipeline's steps up to evaluate, then the calibration suite scored and calibrated."""
    tmp = tmp_path_factory.mktemp("suite")
    cfg = PipelineConfig.model_validate(_demo_like(tmp, tiny_bert_dir))
    store = StepStore(cfg.store)
    data = steps.download(cfg, store)
    model = steps.finetune(cfg, data, steps.tokenise(cfg, data, store), store)
    corrupted = steps.corrupt(cfg, data, store)
    evaluation = steps.evaluate(cfg, data, model, corrupted, store)
    suite = steps.calibration_suite(cfg, corrupted)
    suite_corrupted = steps.corrupt(suite, data, store)
    suite_evaluation = steps.evaluate(suite, data, model, suite_corrupted, store)
    out = steps.calibrate(suite, data, model, suite_corrupted, [suite_evaluation], store)
    return SimpleNamespace(cfg=cfg, store=store, data=data, model=model, corrupted=corrupted, evaluation=evaluation,
                           suite=suite, suite_evaluation=suite_evaluation, out=out)


def test_the_demo_like_run_is_calibrated_on_the_suites_families(run):
    assert steps.calibration_skip_reason(run.cfg, run.corrupted) is not None  # its own one family could not
    payload = steps.read_calibration(run.out)
    assert [s["set"] for s in payload["sets"]] == SUITE_SETS
    assert Calibration.from_dict(payload["calibration"]).families == ("char_swap", "keyboard", "misspelling", "ocr",
                                                                      "tutorial")
    assert run.out.meta["n_sets"] == 13 and payload["reference"]["n"] == 16
    scored = steps.read_predictions([run.suite_evaluation])
    assert sorted(set(scored["method"])) == ["none", "spell"] and set(scored["set"]) == {"clean", *SUITE_SETS}


def test_the_runs_own_evaluation_holds_only_its_own_sets_and_the_suites_clean_scores_match_it(run):
    own = steps.load_results([run.evaluation])["rows"]
    assert {r["set"] for r in own} == {"clean", "keyboard-4"}
    assert run.evaluation.key != run.suite_evaluation.key
    clean = {r["method"]: r["acc"] for r in own if r["set"] == "clean"}
    suite_clean = {r["method"]: r["acc"] for r in steps.load_results([run.suite_evaluation])["rows"]
                   if r["set"] == "clean"}
    assert suite_clean["none"] == clean["none"]  # the same model on the same clean reviews


def test_a_second_pass_serves_the_suite_from_the_store(run):
    again = steps.corrupt(run.suite, run.data, run.store)
    evaluated = steps.evaluate(run.suite, run.data, run.model, again, run.store)
    calibrated = steps.calibrate(run.suite, run.data, run.model, again, [evaluated], run.store)
    assert again.cached and evaluated.cached and calibrated.cached and calibrated.digest == run.out.digest


@pytest.mark.slow
def test_the_flows_summary_is_the_same_with_and_without_the_suite(tmp_path, tiny_bert_dir):
    """The flow on the demo-like config, without the suite (monitoring.calibration_families: []) and with it:
    the same figures, the same cached tasks and the same MLflow grid; only the calibration differs."""
    from mlflow.tracking import MlflowClient
    from prefect.testing.utilities import prefect_test_harness

    from ttt_pipeline.flows.pipeline import ttt_pipeline

    without = PipelineConfig.model_validate(_demo_like(tmp_path, tiny_bert_dir, calibration_families=[]))
    with_suite = PipelineConfig.model_validate(_demo_like(tmp_path, tiny_bert_dir))
    with prefect_test_harness(server_startup_timeout=120):
        a = ttt_pipeline(config=without)
        b = ttt_pipeline(config=with_suite)
    assert a["forecast_calibration"] is None and "this run has 1 (keyboard)" in a["forecast_calibration_note"]
    assert b["forecast_calibration"]["n_sets"] == 13 and b["forecast_calibration_note"] is None
    differ = {"mlflow_run_id", "report", "wall_s", "cached_tasks", "cached", "forecast_calibration",
              "forecast_calibration_note"}
    assert {k: v for k, v in a.items() if k not in differ} == {k: v for k, v in b.items() if k not in differ}
    assert list(a["cached"]) == list(b["cached"]) and all(b["cached"].values())
    client = MlflowClient(with_suite.tracking.tracking_uri)

    def grid(run_id: str) -> dict:
        children = client.search_runs([client.get_run(run_id).info.experiment_id],
                                      f"tags.mlflow.parentRunId = '{run_id}' and tags.mlflow.runName = 'evaluate'")
        return {k: v for k, v in children[0].data.metrics.items() if k != "stage_wall_s"}  # computed, then cached

    assert grid(a["mlflow_run_id"]) == grid(b["mlflow_run_id"])
    assert not any("char_swap" in k or "misspelling" in k for k in grid(b["mlflow_run_id"]))
