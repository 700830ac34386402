"""`evaluate --model` on unlabelled reviews (data.label_column null): the label-free grid's shares and their Wilson
intervals on predictions whose changes are known, the opt-in validated at the edge, the data step's unlabelled
set, and the evaluate step run on it with a tiny classifier (tests/hf_models.py), without Prefect."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.proportion import proportion_confint

from ttt_pipeline.config import load_config
from ttt_pipeline.errors import ConfigError
from ttt_pipeline.evaluation.unlabelled import flat_metrics, label_free_grid, share

N = 10
CLEAN = [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]


def _frame(sets: dict[tuple[str, str], list[int]], seeds: dict[tuple[str, str], int] | None = None) -> pd.DataFrame:
    """Predictions of (set, method) -> classes, in the evaluate step's columns (a masked method at mask seed 1
    unless `seeds` names another)."""
    frames = []
    for (name, method), pred in sets.items():
        kind = "clean" if name == "clean" else "shift" if name.startswith("shift_") else "corrupted"
        family, severity = (name.rsplit("-", 1) if kind == "corrupted" else (None, None))
        seed = (seeds or {}).get((name, method), 1) if "masked" in method else None
        frames.append(pd.DataFrame({"kind": kind, "set": name, "family": family,
                                    "severity": None if severity is None else int(severity), "method": method,
                                    "mask_seed": seed, "index": range(N), "label": -1, "pred": pred}))
    frame = pd.concat(frames, ignore_index=True)
    frame["severity"], frame["mask_seed"] = frame["severity"].astype("Int64"), frame["mask_seed"].astype("Int64")
    return frame


def _flip(pred: list[int], where: list[int]) -> list[int]:
    return [1 - p if i in where else p for i, p in enumerate(pred)]


def test_changed_and_restored_shares_count_against_the_clean_prediction():
    noisy = _flip(CLEAN, [0, 1, 2, 3])  # none changes 4 of 10
    spelled = _flip(CLEAN, [0, 1, 9])  # restores 2 and 3, keeps 0 and 1 changed, breaks 9
    grid = label_free_grid(_frame({("clean", "none"): CLEAN, ("clean", "spell"): _flip(CLEAN, [5]),
                                   ("keyboard-3", "none"): noisy, ("keyboard-3", "spell"): spelled,
                                   ("shift_books", "none"): CLEAN}), 0.95)
    assert [r["set"] for r in grid] == ["clean", "keyboard-3"]  # a shifted domain has no clean copy
    clean, kb = grid
    assert clean["changed"] is None and clean["family"] is None and clean["n"] == N
    assert clean["defenses"]["spell"]["changed"]["count"] == 1 and clean["defenses"]["spell"]["restored"] is None
    assert (kb["family"], kb["severity"]) == ("keyboard", 3)
    assert kb["changed"]["share"] == 0.4 and kb["changed"]["n"] == N
    spell = kb["defenses"]["spell"]
    assert spell["changed"]["share"] == 0.3 and (spell["restored"]["count"], spell["restored"]["n"]) == (2, 4)
    low, high = proportion_confint(2, 4, alpha=0.05, method="wilson")
    assert (spell["restored"]["ci_low"], spell["restored"]["ci_high"]) == pytest.approx((low, high))
    assert flat_metrics(grid) == {"changed/clean/spell": 0.1, "changed/keyboard/3/none": 0.4,
                                  "changed/keyboard/3/spell": 0.3, "restored/keyboard/3/spell": 0.5}


def test_a_masked_defense_is_read_at_its_first_mask_seed_and_an_unchanged_set_restores_nothing():
    frame = pd.concat([_frame({("clean", "none"): CLEAN, ("ocr-1", "none"): CLEAN}),
                       _frame({("ocr-1", "spell+masked_ttt"): _flip(CLEAN, [4])}, {("ocr-1", "spell+masked_ttt"): 2}),
                       _frame({("ocr-1", "spell+masked_ttt"): CLEAN}, {("ocr-1", "spell+masked_ttt"): 7})])
    ocr = label_free_grid(frame, 0.9)[1]
    assert ocr["changed"]["count"] == 0 and ocr["changed"]["ci_low"] == pytest.approx(0.0, abs=1e-12)
    assert ocr["changed"]["ci_high"] == pytest.approx(proportion_confint(0, N, alpha=0.1, method="wilson")[1])
    masked = ocr["defenses"]["spell+masked_ttt"]
    assert masked["changed"]["count"] == 1 and masked["restored"] is None  # seed 2, not 7; nothing to restore
    assert "changed/ocr/1/spell-ttt" in flat_metrics([ocr])


def test_no_clean_predictions_is_an_error_and_an_empty_share_is_none():
    with pytest.raises(ValueError, match="no clean reviews under none"):
        label_free_grid(_frame({("keyboard-1", "none"): CLEAN}), 0.95)
    assert share(0, 0, 0.95) is None
    assert share(3, 3, 0.95)["ci_high"] == pytest.approx(1.0)


UNLABELLED = ["data.label_column=null", "data.label_map=null"]


@pytest.mark.parametrize("extra, words", [
    (["data.label_column=null"], "label_map read labels or split labelled reviews, and label_column is null"),
    ([*UNLABELLED, "data.label_names=null"], "set data.label_names to the model's labels"),
    ([*UNLABELLED, "data.test_path=x.csv", "data.group_column=movie"], "set data.test_path, data.group_column to null"),
])
def test_the_opt_in_stops_at_the_edge_where_a_setting_needs_labels(extra, words):
    with pytest.raises(ConfigError) as err:
        load_config("demo", extra)
    assert words in err.value.message and err.value.hint


def test_run_refuses_unlabelled_reviews_before_any_work():
    from ttt_pipeline.flows.pipeline import ttt_pipeline

    with pytest.raises(ConfigError) as err:
        ttt_pipeline.fn(config=load_config("demo", UNLABELLED))
    assert "data.label_column is null" in err.value.message and "evaluate --model" in err.value.hint


def _reviews(tmp: Path, n: int = 30) -> Path:
    path = tmp / "unlabelled.jsonl"
    texts = [f"review {i}: the sound is {'great and clear' if i % 2 else 'awful, it broke'} after a week"
             for i in range(n)]
    path.write_text("".join(json.dumps({"body": t}) + "\n" for t in texts + ["   "]))
    return path


def _unlabelled_config(tmp: Path, *extra: str):
    return load_config("demo", [*UNLABELLED, f"data.path={_reviews(tmp)}", "data.text_column=body",
                                f"store={tmp / 'store'}", *extra])


def test_the_data_step_keeps_every_review_as_an_unlabelled_test_set(tmp_path):
    from ttt_pipeline import steps
    from ttt_pipeline.data.prepare import NO_LABEL, load_prepared
    from ttt_pipeline.storage import StepStore

    out = steps.download(_unlabelled_config(tmp_path), StepStore(tmp_path / "store"))
    ds, names = load_prepared(out.path)
    assert list(ds) == ["test"] and len(ds["test"]) == 30 and set(ds["test"]["label"]) == {NO_LABEL}
    assert out.meta["labelled"] is False and out.meta["sizes"] == {"test": 30}
    assert out.meta["dropped_empty_text"] == 1 and out.meta["label_names"] == ["negative", "positive"]
    capped = steps.download(_unlabelled_config(tmp_path, "data.max_test_samples=12"), StepStore(tmp_path / "store"))
    again = steps.download(_unlabelled_config(tmp_path, "data.max_test_samples=12"), StepStore(tmp_path / "store"))
    texts = load_prepared(capped.path)[0]["test"]["text"]
    assert len(texts) == 12 and set(texts) < set(ds["test"]["text"]) and again.digest == capped.digest
    assert "labelled" not in steps.download(load_config("demo", [f"store={tmp_path / 'store'}"]),
                                            StepStore(tmp_path / "store")).meta  # the labelled path as it was


def test_the_evaluate_step_scores_unlabelled_reviews_and_the_grid_reads_its_predictions(tmp_path):
    from hf_models import save_classifier

    from ttt_pipeline import steps
    from ttt_pipeline.cli.console import summary_table
    from ttt_pipeline.modeling.hf_classifier import Source
    from ttt_pipeline.storage import StepStore

    cfg = _unlabelled_config(tmp_path, "ttt.methods=[none, spell]", "corruption.families=[keyboard, ocr]",
                             "corruption.severities=[5]", "evaluation.signal_reviews=0")
    store = StepStore(cfg.store)
    folder = save_classifier(tmp_path / "clf", "bert")
    data = steps.download(cfg, store)
    model = steps.import_model(cfg, data, Source(str(folder), str(folder), str(folder)), store)
    scored, _ = steps.evaluated_config(cfg, model)
    corrupted = steps.corrupt(scored, data, store)
    evaluation = steps.evaluate(scored, data, model, corrupted, store)
    preds = steps.read_predictions([evaluation])
    grid = label_free_grid(preds, 0.95)
    assert [r["set"] for r in grid] == ["clean", "keyboard-5", "ocr-5"]
    clean = preds[(preds.set == "clean") & (preds.method == "none")].sort_values("index").pred.to_numpy()
    for row in grid[1:]:
        mine = preds[(preds.set == row["set"]) & (preds.method == "none")].sort_values("index").pred.to_numpy()
        assert row["changed"]["count"] == int(np.sum(mine != clean)) and row["n"] == 30
    summary = {"labelled": False, "label_free": grid, "n": 30, "confidence": 0.95, "forecast_note": "none here"}
    table = summary_table(summary)
    assert table.splitlines()[0].split("  ")[0] == "set" and "keyboard-5" in table and "spell: restored" in table
    assert "30 unlabelled reviews" in table and "label-free drop forecast: none here" in table
