"""The scoring grid: which (set, method, mask seed) jobs run, and what a job's row and predictions hold."""

from __future__ import annotations

import numpy as np
import pytest

from ttt_pipeline.config import EvaluationConfig, TTTConfig
from ttt_pipeline.evaluation import grid
from ttt_pipeline.evaluation.grid import TestSet
from ttt_pipeline.evaluation.scoring import score_texts

TEXTS = ["the battery died after two days", "great little speaker , loud and clear", "terrible", "works fine"]
LABELS = [0, 1, 0, 1]
SETS = [TestSet("clean", "clean", TEXTS, LABELS), TestSet("shift", "shift_books", TEXTS[:2], LABELS[:2]),
        TestSet("corrupted", "typo-3", ["teh battery", "grreat", "terible", "wroks"], LABELS, "typo", 3)]


def test_jobs_are_sets_by_methods_by_mask_seeds():
    ttt = TTTConfig(methods=["none", "spell", "masked_ttt"], mask_seeds=2, score_clean=False)
    got = [(j.test_set.name, j.method.name, j.mask_seed) for j in grid.jobs(SETS, ttt)]
    assert got[:1] == [("clean", "none", None)]  # defenses skip clean text without ttt.score_clean
    assert got[1:6] == [("shift_books", "none", None), ("shift_books", "spell", None),
                        ("shift_books", "masked_ttt", 0), ("shift_books", "masked_ttt", 1), ("typo-3", "none", None)]
    assert len(got) == 1 + 4 + 4
    assert len(grid.jobs(SETS, ttt.model_copy(update={"score_clean": True}))) == 3 * 4


@pytest.fixture(scope="module")
def tiny(make_tiny_clf):
    return make_tiny_clf(["neg", "pos"])


def test_a_row_and_its_predictions_are_the_scoring_functions(tiny):
    model, tok = tiny
    ttt = TTTConfig(methods=["none", "mask_ensemble"], mask_seeds=[3], batch_size=2)
    ev = EvaluationConfig(signal_reviews=4)
    jobs = grid.jobs(SETS[2:], ttt)
    seen = []
    rows, preds = grid.score_grid(jobs, model, tok, ttt, ev, 48, "cpu", grid.build_repairs(ttt, lambda: TEXTS),
                                  lambda done, total: seen.append((done, total)))
    assert [(r["set"], r["method"], r["mask_seed"]) for r in rows] == [("typo-3", "none", None),
                                                                       ("typo-3", "mask_ensemble", 3)]
    want, _ = score_texts(model, tok, SETS[2].texts, "mask_ensemble", ttt.model_copy(update={"seed": 3}), 48, 2)
    assert np.allclose(np.asarray(preds[1]["probs"]), np.exp(want) / np.exp(want).sum(-1, keepdims=True), atol=1e-6)
    assert preds[1]["pred"] == want.argmax(-1).tolist() and preds[1]["label"] == LABELS
    assert rows[1]["acc"] == pytest.approx(np.mean(want.argmax(-1) == np.asarray(LABELS)))
    assert rows[1]["acc_ci_low"] <= rows[1]["acc"] <= rows[1]["acc_ci_high"] and rows[1]["n"] == 4
    assert "mlm_loss" in rows[0] and "mlm_loss" not in rows[1]  # the MLM signal is measured once, on `none`'s row
    assert seen[-1] == (8, 8)
    sample = grid.samples(SETS[2:], preds, ["neg", "pos"])
    assert len(sample) == 4 and sample[0]["text"] == "teh battery" and {"pred_none", "pred_mask_ensemble"} <= set(sample[0])
