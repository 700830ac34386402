"""The calibrate step: the label-free drop forecast fitted on the run's own corrupted sets, stored, logged on the
parent MLflow run and read back for a registered model version; skipped, with the reason, where it cannot be fitted.

The tiny pipeline (a random 2-layer BERT fine-tuned one epoch on 40 demo reviews, 16 test reviews, the tutorial
composite and keyboard typos at severities 1 and 3) runs in this process, without Prefect."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from tiny_config import tiny_config

from ttt_pipeline import steps
from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.evaluation.forecast import Calibration, forecast
from ttt_pipeline.storage import StepOutput, StepStore


def _config(tmp: Path, model_dir: Path, methods: tuple[str, ...] = ("none", "spell"), **evaluation) -> PipelineConfig:
    return PipelineConfig.model_validate(tiny_config(
        tmp, model_dir, suite="ops", corruption={"families": ["tutorial", "keyboard"], "severities": [1, 3]},
        ttt={"methods": list(methods), "batch_size": 8},
        evaluation={"default_defense": "spell", "signal_reviews": 0, **evaluation}))


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_bert_dir) -> SimpleNamespace:
    """The tiny pipeline's stored outputs up to evaluate, and its calibration."""
    tmp = tmp_path_factory.mktemp("calibrate")
    cfg = _config(tmp, tiny_bert_dir)
    store = StepStore(cfg.store)
    data = steps.download(cfg, store)
    model = steps.finetune(cfg, data, steps.tokenise(cfg, data, store), store)
    corrupted = steps.corrupt(cfg, data, store)
    evaluation = steps.evaluate(cfg, data, model, corrupted, store)
    out = steps.calibrate(cfg, data, model, corrupted, [evaluation], store)
    return SimpleNamespace(tmp=tmp, cfg=cfg, store=store, data=data, model=model, corrupted=corrupted,
                           evaluation=evaluation, out=out, payload=steps.read_calibration(out))


def test_each_sets_drop_is_the_evaluations_clean_minus_set_accuracy_under_none(run):
    rows = steps.load_results([run.evaluation])["rows"]
    acc = {r["set"]: r["acc"] for r in rows if r["method"] == "none"}
    sets = run.payload["sets"]
    assert [s["set"] for s in sets] == ["tutorial-1", "keyboard-1", "keyboard-3"]
    assert run.payload["reference"]["accuracy"] == pytest.approx(acc["clean"], abs=1e-12)
    for s in sets:
        assert s["accuracy"] == pytest.approx(acc[s["set"]], abs=1e-12)
        assert s["drop"] == pytest.approx(acc["clean"] - acc[s["set"]], abs=1e-12)
    cal = Calibration.from_dict(run.payload["calibration"])
    assert cal.families == ("keyboard", "tutorial") and cal.test_accuracy == pytest.approx(acc["clean"])
    assert [(p["family"], p["severity"], p["drop"]) for p in cal.held_out] == \
        [(s["family"], s["severity"], pytest.approx(s["drop"])) for s in sets]
    assert [s["forecast"] for s in sets] == [p["forecast"] for p in cal.held_out]
    assert forecast(cal, run.payload["reference"]["descriptors"])["delta"] == 0.0  # the clean set forecasts no drop


def test_descriptors_read_the_repair_the_defense_and_the_none_predictions(run):
    """The clean set is repaired less than keyboard-1 and keyboard-1 less than keyboard-3; the change rate is the
    share of reviews `spell` predicts otherwise than `none`, and confidences and label shares come from `none`'s
    probabilities."""
    preds = steps.read_predictions([run.evaluation])
    ref = run.payload["reference"]["descriptors"]
    by_set = {s["set"]: s["descriptors"] for s in run.payload["sets"]}
    assert ref["repaired_words_share"] < by_set["keyboard-1"]["repaired_words_share"] \
        < by_set["keyboard-3"]["repaired_words_share"]
    assert ref["n"] == run.payload["reference"]["n"] == 16 and ref["label_share_shift"] is None
    assert run.payload["reference"]["label_shares"] == ref["label_shares"]
    assert run.payload["reference"]["label_names"] == ["1", "2", "3", "4", "5"]
    for name, window in {"clean": ref, **by_set}.items():
        none = preds[(preds.set == name) & (preds.method == "none")].sort_values("index")
        spell = preds[(preds.set == name) & (preds.method == "spell")].sort_values("index")
        probs = np.stack(none.probs.to_numpy())
        assert window["defense_change_rate"] == pytest.approx(np.mean(none.pred.to_numpy() != spell.pred.to_numpy()))
        assert window["mean_confidence"] == pytest.approx(probs.max(axis=1).mean())
        assert window["label_shares"] == pytest.approx(np.bincount(probs.argmax(1), minlength=5) / 16)
        assert window["share_above_threshold"] is not None
    assert json.loads(json.dumps(run.payload)) == run.payload  # plain JSON all through


def _graded_evaluation(run, wrong: dict[str, int], changed: dict[str, int]) -> StepOutput:
    """An evaluate output whose predictions are known: `none` right on every review but the first wrong[set] of
    each set, `spell` otherwise than `none` on the first changed[set] (the tiny random model predicts one class
    whatever the noise, so its drops are all 0)."""
    from ttt_pipeline.data.prepare import load_prepared

    labels = list(load_prepared(run.data.path)[0]["test"]["label"])
    n = len(labels)

    def build(tmp: Path) -> dict:
        frames = []
        for name in ["clean", *run.corrupted.meta["sets"]]:
            meta = run.corrupted.meta["sets"].get(name, {})
            none = [(y + 1) % 5 if i < wrong.get(name, 0) else y for i, y in enumerate(labels)]
            spell = [(p + 1) % 5 if i < changed.get(name, 0) else p for i, p in enumerate(none)]
            for method, pred in (("none", none), ("spell", spell)):
                probs = [[0.9 if c == p else 0.025 for c in range(5)] for p in pred]
                frames.append(pd.DataFrame({"kind": "clean" if name == "clean" else "corrupted", "set": name,
                                            "family": meta.get("family"), "severity": meta.get("severity"),
                                            "method": method, "mask_seed": None, "index": range(n), "label": labels,
                                            "pred": pred, "probs": probs}))
        frame = pd.concat(frames, ignore_index=True)
        frame["severity"], frame["mask_seed"] = frame["severity"].astype("Int64"), frame["mask_seed"].astype("Int64")
        frame.to_parquet(tmp / "predictions.parquet", index=False)
        (tmp / "results.json").write_text(json.dumps({"rows": [], "samples": [], "label_names": list("12345")}))
        return {}

    return run.store.run("graded-evaluation", {"wrong": wrong, "changed": changed}, build)


def test_known_drops_are_measured_and_forecast_from_the_repaired_words(run):
    """Drops that grow with the noise the repair sees (keyboard-3 > keyboard-1) give a positive slope and forecasts
    that grow with the noise; each set's drop and change rate are measured exactly."""
    wrong = {"tutorial-1": 2, "keyboard-1": 1, "keyboard-3": 4}
    changed = {"keyboard-1": 1, "keyboard-3": 3}
    graded = _graded_evaluation(run, wrong, changed)
    out = steps.calibrate(run.cfg, run.data, run.model, run.corrupted, [graded], run.store)
    payload = steps.read_calibration(out)
    assert payload["reference"]["accuracy"] == 1.0 and payload["reference"]["descriptors"]["mean_confidence"] == \
        pytest.approx(0.9)
    by_set = {s["set"]: s for s in payload["sets"]}
    for name, k in wrong.items():
        assert by_set[name]["drop"] == pytest.approx(k / 16) and by_set[name]["accuracy"] == pytest.approx(1 - k / 16)
        assert by_set[name]["descriptors"]["defense_change_rate"] == pytest.approx(changed.get(name, 0) / 16)
        assert by_set[name]["baselines"]["doc"] == pytest.approx(0.0)  # the confidences do not move: DoC sees nothing
    cal = Calibration.from_dict(payload["calibration"])
    assert cal.coefficients[0] > 0
    assert forecast(cal, by_set["keyboard-3"]["descriptors"])["delta"] > \
        forecast(cal, by_set["keyboard-1"]["descriptors"])["delta"] > 0
    assert out.meta["n_sets"] == 3 and out.meta["loo_mae"] == pytest.approx(
        np.mean([abs(s["drop"] - s["forecast"]) for s in payload["sets"]]))


def test_an_unchanged_rerun_is_served_from_the_store_and_the_summary_matches_the_payload(run):
    again = steps.calibrate(run.cfg, run.data, run.model, run.corrupted, [run.evaluation], run.store)
    assert again.cached and again.key == run.out.key and again.digest == run.out.digest
    summary = steps.calibration_summary(run.payload)
    cal = run.payload["calibration"]
    assert summary == {**{k: run.out.meta[k] for k in ("model", "loo_mae", "coverage", "n_sets")}}
    assert summary["n_sets"] == 3 and summary["loo_mae"] == cal["held_out_errors"][cal["model"]]
    assert 0.0 <= summary["coverage"] <= 1.0
    other = _config(run.tmp, Path(run.cfg.model.name))
    other.ttt.spell.max_edit_distance = 1  # another repair describes the sets anew
    assert steps.calibrate_inputs(other, run.data, run.model, run.corrupted, [run.evaluation]) != \
        steps.calibrate_inputs(run.cfg, run.data, run.model, run.corrupted, [run.evaluation])


@pytest.mark.parametrize("defense, words", [
    ("mask_ensemble", "the default defense mask_ensemble repairs no text"),
    (None, "evaluation.default_defense is null"),
])
def test_a_default_defense_without_a_text_repair_skips_with_the_reason(run, caplog, defense, words):
    cfg = _config(run.tmp, Path(run.cfg.model.name), ("none", "spell", "mask_ensemble"), default_defense=defense)
    caplog.set_level(logging.INFO, logger="ttt_pipeline.steps.calibrate_step")
    assert steps.calibrate(cfg, run.data, run.model, run.corrupted, [run.evaluation], run.store) is None
    assert words in steps.calibration_skip_reason(cfg, run.corrupted)
    assert any(words in r.getMessage() and "skipped" in r.getMessage() for r in caplog.records)


def test_one_corruption_family_skips_too(run):
    one = replace(run.corrupted, meta={"sets": {k: v for k, v in run.corrupted.meta["sets"].items()
                                                 if v["family"] == "keyboard"}})
    reason = steps.calibration_skip_reason(run.cfg, one)
    assert "this run has 1 (keyboard)" in reason and "corruption.families" in reason


def test_a_set_the_defense_did_not_score_has_no_change_rate():
    """Defenses skip clean text when ttt.score_clean is off: the clean window then has no defense_change_rate."""
    from ttt_pipeline.evaluation.descriptors import window_descriptors
    from ttt_pipeline.steps.calibrate_step import _measure

    frame = pd.DataFrame({"set": "clean", "method": "none", "mask_seed": pd.array([None, None], dtype="Int64"),
                          "index": [0, 1], "label": [0, 1], "pred": [0, 0], "probs": [[0.9, 0.1], [0.6, 0.4]]})
    meta, m = _measure({"set": "clean"}, ["good one", "bad one"], frame, "spell",
                       [lambda texts: [t.upper() for t in texts]], {"good"}, {"LATIN"})
    assert m["accuracy"] == 0.5 and m["confidences"] == [0.9, 0.6]
    window = window_descriptors(*m["window"])
    assert window["defense_change_rate"] is None and window["oov_words_share"] == pytest.approx(0.75)


def test_a_masked_default_defense_is_read_at_its_first_mask_seed():
    from ttt_pipeline.steps.calibrate_step import _rows

    frame = pd.DataFrame({"set": "s", "method": "m", "mask_seed": pd.array([3, 3, 1, 1], dtype="Int64"),
                          "index": [1, 0, 1, 0], "pred": [5, 6, 7, 8]})
    assert _rows(frame, "s", "m", 2)["pred"].tolist() == [8, 7]
    assert _rows(frame, "s", "other", 2) is None
    with pytest.raises(ValueError, match="s under m: 2 predictions for 3 reviews"):
        _rows(frame, "s", "m", 3)


def test_the_payload_round_trips_through_the_parent_run_and_a_registered_version(run, tmp_path):
    from mlflow.tracking import MlflowClient

    from ttt_pipeline.io.calibration_store import load_calibration, log_calibration
    from ttt_pipeline.io.tracking import Tracker

    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "calibration", str(tmp_path / "mlruns"))
    parent = tracker.start("pipeline")
    child = tracker.start("finetune", parent=parent)
    log_calibration(tracker, parent, run.payload)
    client: MlflowClient = tracker.client
    metrics = client.get_run(parent).data.metrics
    summary = steps.calibration_summary(run.payload)
    assert metrics["forecast/loo_mae"] == pytest.approx(summary["loo_mae"])
    assert metrics["forecast/coverage"] == pytest.approx(summary["coverage"])
    tagged = SimpleNamespace(tags={"parent_run_id": parent}, run_id=None)
    by_source = SimpleNamespace(tags={}, run_id=child)  # no tag: the source run's parent
    assert load_calibration(client, tagged) == load_calibration(client, by_source) == run.payload
    other = tracker.start("no calibration")
    assert load_calibration(client, SimpleNamespace(tags={"parent_run_id": other}, run_id=None)) is None
    assert load_calibration(client, SimpleNamespace(tags={}, run_id=other)) is None  # a run without a parent


def _cli(tmp: Path, *args: str) -> dict:
    """`ttt-pipeline ARGS --json` in a subprocess (its own Prefect home); the JSON summary and the printed text."""
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "ttt_pipeline.cli.main", *args, "--json"], capture_output=True,
                          text=True, timeout=900, cwd=tmp,
                          env={**os.environ, "PREFECT_HOME": str(tmp / "prefect"), "HF_HUB_OFFLINE": "1",
                               "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "stdout": proc.stdout}


@pytest.mark.slow
def test_run_and_evaluate_model_report_the_calibration_and_the_registered_version_reads_it(tmp_path, tiny_bert_dir):
    """`run`: the calibration in the summary, its line in the terminal, calibration.json on the parent run, read
    back through the registered version. `evaluate --model` on the demo (one corruption family) with the calibration
    suite of its own off: no calibration, and the summary and the terminal say why."""
    import yaml
    from hf_models import save_classifier
    from mlflow.tracking import MlflowClient

    from ttt_pipeline.io.calibration_store import load_calibration

    cfg = _config(tmp_path, tiny_bert_dir)
    raw = {**cfg.model_dump(mode="json"), "registry": {"enabled": True, "model_name": "tiny-calibrated"}}
    raw["monitoring"]["calibration_families"] = []  # the run's own three sets, not the calibration suite
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(raw))
    summary = _cli(tmp_path, "run", "--config", str(tmp_path / "tiny.yaml"))
    fc = summary["forecast_calibration"]
    assert set(fc) == {"model", "loo_mae", "coverage", "n_sets"} and fc["n_sets"] == 3
    assert summary["forecast_calibration_note"] is None
    assert len(summary["cached"]) == 5 and "calibrate" not in summary["cached"]  # the run's five tasks, as before
    assert f"label-free drop forecast: {fc['model']} model on 3 corrupted sets" in summary["stdout"]
    client = MlflowClient(cfg.tracking.tracking_uri)
    version = client.get_model_version_by_alias("tiny-calibrated", "champion")
    payload = load_calibration(client, version)
    stored = [steps.read_calibration(o) for o in (StepStore(cfg.store).load("calibrate", p.parent.name)
                                                  for p in (Path(cfg.store) / "calibrate").glob("*/manifest.json"))]
    assert payload is not None and stored == [payload]
    assert client.get_run(summary["mlflow_run_id"]).data.metrics["forecast/loo_mae"] == pytest.approx(fc["loo_mae"])
    folder = save_classifier(tmp_path / "clf", "bert")
    brought = _cli(tmp_path, "evaluate", "--model", str(folder), "--config", "demo", "--set", f"store={cfg.store}",
                   "--set", f"tracking.tracking_uri={cfg.tracking.tracking_uri}", "--set",
                   f"tracking.artifact_root={cfg.tracking.artifact_root}", "--set", "data.max_test_samples=16",
                   "--set", "registry.enabled=false", "--set", "monitoring.calibration_families=[]")
    assert brought["forecast_calibration"] is None and "this run has 1 (keyboard)" in brought[
        "forecast_calibration_note"]
    assert "label-free drop forecast: not calibrated (the forecast is calibrated on" in brought["stdout"]
