"""bench/defenses.py's selection rule (version 3) and its validation sets, on made-up scores: no model, no data."""

from __future__ import annotations

import numpy as np
import pytest


def store(scores: dict[str, dict[str, tuple[float, float]]]) -> dict:
    """val store from {defense: {set: (accuracy over 100 reviews, wall seconds)}}."""
    out = {}
    for d, sets in scores.items():
        for s, (acc, wall) in sets.items():
            correct = (np.arange(100) < round(acc * 100)).astype(float)
            out[(d, s)] = [{"correct": correct, "wall": wall, "n": 100}]
    return out


def scores(clean: float, corrupted: float, wall: float = 1.0) -> dict:
    return {"clean": (clean, wall), "tutorial-3": (corrupted, wall), "tutorial-3@8": (corrupted, wall)}


def test_accuracy_alone_ranks_the_eligible_speed_only_bars(defenses_bench):
    val = store({"none": scores(0.60, 0.50), "augment": scores(0.60, 0.56, wall=1.0),
                 "augment+spell": scores(0.60, 0.57, wall=1.5), "masked_ttt": scores(0.60, 0.70, wall=20.0)})
    chosen = defenses_bench.select_default(val, ["none", "augment", "augment+spell", "masked_ttt"], min_speed=50)
    # one point better on validation wins though 50% slower (version 1's tie band gave it to the faster);
    # masked_ttt is the most accurate but under the 50 reviews/s bar (100 reviews in 20 s)
    assert chosen["name"] == "augment+spell"
    assert chosen["eligible"] == ["augment", "augment+spell"]
    assert chosen["validation"]["augment+spell"]["acc_corrupted"] == pytest.approx(0.57)


def test_exact_ties_go_to_fewer_components_and_clean_loss_excludes(defenses_bench):
    val = store({"none": scores(0.60, 0.50), "spell": scores(0.58, 0.60), "augment+spell": scores(0.60, 0.56),
                 "augment": scores(0.595, 0.56, wall=2.0)})
    chosen = defenses_bench.select_default(val, ["none", "spell", "augment+spell", "augment"], min_speed=50)
    assert "spell" not in chosen["eligible"]  # 2 points under none's clean accuracy
    assert chosen["name"] == "augment"  # tied with augment+spell: the one with fewer components


def test_no_eligible_candidate_keeps_none(defenses_bench):
    val = store({"none": scores(0.60, 0.50), "masked_ttt": scores(0.60, 0.55, wall=10.0)})
    assert defenses_bench.select_default(val, ["none", "masked_ttt"], min_speed=50)["name"] == "none"


def test_every_validation_seed_is_a_corrupted_set(defenses_bench):
    seeds = [7, 8, 9]
    keys = ["clean"] + [defenses_bench.val_key(f, s, seeds) for f in ("tutorial", "word_swap") for s in seeds]
    assert keys[1:4] == ["tutorial-3", "tutorial-3@8", "tutorial-3@9"]
    assert defenses_bench.corrupted_sets(dict.fromkeys(keys + ["kitchen"])) == keys[1:]


def test_version_3_a_retrained_lead_inside_the_interval_goes_to_the_plain_model(defenses_bench):
    # augment+spell leads spell by 2 points on 100 reviews (2 reviews): the paired interval reaches 0
    val = store({"none": scores(0.60, 0.50), "spell": scores(0.60, 0.60), "augment+spell": scores(0.60, 0.62)})
    chosen = defenses_bench.select_default(val, ["none", "spell", "augment+spell"], min_speed=50)
    assert chosen["name"] == "spell"
    vs = chosen["retrained_vs_plain"]
    assert (vs["plain"], vs["retrained"]) == ("spell", "augment+spell")
    assert vs["delta"] == pytest.approx(0.02) and vs["ci_low"] <= 0 < vs["ci_high"]


def test_version_3_a_retrained_lead_above_the_interval_stands(defenses_bench):
    val = store({"none": scores(0.60, 0.50), "spell": scores(0.60, 0.55), "augment+spell": scores(0.60, 0.75)})
    chosen = defenses_bench.select_default(val, ["none", "spell", "augment+spell"], min_speed=50)
    assert chosen["name"] == "augment+spell"
    assert chosen["retrained_vs_plain"]["ci_low"] > 0
    assert chosen["rule_version"] == 3


def test_version_3_leaves_plain_model_choices_alone(defenses_bench):
    val = store({"none": scores(0.60, 0.50), "spell": scores(0.60, 0.62), "augment": scores(0.60, 0.61)})
    chosen = defenses_bench.select_default(val, ["none", "spell", "augment"], min_speed=50)
    assert chosen["name"] == "spell" and "retrained_vs_plain" not in chosen


def test_kept_validation_scores_give_the_same_choice(defenses_bench, tmp_path):
    val = store({"none": scores(0.60, 0.50), "spell": scores(0.60, 0.60), "augment+spell": scores(0.60, 0.62)})
    val[("spell", "clean")].append({"correct": np.ones(100), "wall": 0.5, "n": 100})  # a second draw (mask seed)
    path = tmp_path / "validation.npz"
    defenses_bench.save_validation(val, str(path))
    back = defenses_bench.load_validation(str(path))
    assert set(back) == set(val)
    for key, entries in val.items():
        assert [(list(e["correct"]), e["wall"], e["n"]) for e in back[key]] == \
            [(list(e["correct"]), e["wall"], e["n"]) for e in entries]
    defenses = ["none", "spell", "augment+spell"]
    assert defenses_bench.select_default(back, defenses, 50) == defenses_bench.select_default(val, defenses, 50)
