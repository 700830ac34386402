"""Aggregate robustness metrics and the run's statistics contract, on hand-made predictions."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ttt_pipeline.evaluation import robustness

N = 200


def _frame(set_name, kind, family, severity, method, seed, labels, preds):
    return pd.DataFrame({"kind": kind, "set": set_name, "family": family, "severity": severity, "method": method,
                         "mask_seed": seed, "index": range(len(labels)), "label": labels, "pred": preds})


def _row(kind, set_name, family, severity, method, acc, seed=None):
    return {"kind": kind, "set": set_name, "family": family, "severity": severity, "method": method, "acc": acc,
            "mask_seed": seed, "macro_f1": acc, "n": N}


@pytest.fixture()
def grid():
    """Clean 0.80; keyboard-1 0.70, keyboard-3 0.50 without defense; masked TTT (2 seeds) +0.05 on each set."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, N)

    def preds_with(acc, salt):
        p = y.copy()
        wrong = np.random.default_rng(salt).permutation(N)[: int(round((1 - acc) * N))]
        p[wrong] = 1 - p[wrong]
        return p

    frames, rows = [], []
    clean = preds_with(0.8, 1)
    frames.append(_frame("clean", "clean", None, None, "none", None, y, clean))
    rows.append(_row("clean", "clean", None, None, "none", 0.8))
    for seed in (0, 1):
        frames.append(_frame("clean", "clean", None, None, "masked_ttt", seed, y, clean))
        rows.append(_row("clean", "clean", None, None, "masked_ttt", 0.8, seed))
    for sev, acc in ((1, 0.7), (3, 0.5)):
        name = f"keyboard-{sev}"
        base = preds_with(acc, 10 + sev)
        frames.append(_frame(name, "corrupted", "keyboard", sev, "none", None, y, base))
        rows.append(_row("corrupted", name, "keyboard", sev, "none", acc))
        wrong = np.flatnonzero(base != y)
        for seed in (0, 1):
            fixed = base.copy()
            fixed[wrong[: int(0.05 * N)]] = y[wrong[: int(0.05 * N)]]
            frames.append(_frame(name, "corrupted", "keyboard", sev, "masked_ttt", seed, y, fixed))
            rows.append(_row("corrupted", name, "keyboard", sev, "masked_ttt", acc + 0.05, seed))
    return pd.concat(frames, ignore_index=True), rows


def test_corruption_errors_follow_the_definitions(grid):
    _, rows = grid
    own = robustness.corruption_errors(rows, "masked_ttt")
    # CE = (0.25 + 0.45) / (0.30 + 0.50); relative CE = ((0.25-0.2) + (0.45-0.2)) / ((0.3-0.2) + (0.5-0.2))
    assert own["ce"]["keyboard"] == pytest.approx(0.70 / 0.80)
    assert own["mce"] == pytest.approx(0.875)
    assert own["rel_mce"] == pytest.approx(0.30 / 0.40)
    assert robustness.corruption_errors(rows, "none")["mce"] == pytest.approx(1.0)
    # a reference model with twice the errors halves the CE
    ref = [{**r, "acc": 1 - 2 * (1 - r["acc"])} for r in rows if r["method"] == "none"]
    assert robustness.corruption_errors(rows, "none", ref)["ce"]["keyboard"] == pytest.approx(0.5)


def test_recovery_ratio_and_flip_rate(grid):
    preds, rows = grid
    # drop summed over severities 0.1 + 0.3, gain 0.05 + 0.05
    assert robustness.recovery_ratio(rows, "masked_ttt") == pytest.approx(0.10 / 0.40)
    clean = preds[(preds["set"] == "clean") & (preds["method"] == "none")]["pred"].to_numpy()
    flips = [(preds[(preds["set"] == s) & (preds["method"] == "none")]["pred"].to_numpy() != clean).mean()
             for s in ("keyboard-1", "keyboard-3")]
    assert robustness.flip_rate(preds) == pytest.approx(np.mean(flips))


def test_run_statistics_contract(grid):
    preds, rows = grid
    stats = robustness.run_statistics(rows, preds, [0, 1], resamples=2000)
    g = stats["ttt_gain"]
    assert set(g) >= {"delta", "ci_low", "ci_high", "p_mcnemar", "helped", "hurt", "significant", "mask_seeds"}
    # 10 reviews fixed in each of the two sets: a review counts once, however many sets it was fixed in
    assert g["delta"] == pytest.approx(0.05) and g["hurt"] == 0 and 10 < g["helped"] <= 20 and g["significant"]
    assert g["mask_seeds"] == [0, 1]
    assert stats["ttt_clean_change"]["delta"] == 0 and not stats["ttt_clean_change"]["significant"]
    assert stats["corruption_drop"]["delta"] == pytest.approx(0.8 - 0.6) and stats["corruption_drop"]["significant"]
    assert stats["mce"]["masked_ttt"] == pytest.approx(0.875) and "flip_rate" in stats
    flat = robustness.flat_metrics(stats, robustness.comparisons(preds, 2, resamples=2000))
    assert flat["ttt_gain"] == pytest.approx(0.05) and flat["ttt_gain_significant"] == 1.0
    assert flat["ttt_gain_ci_low"] <= 0.05 <= flat["ttt_gain_ci_high"]
    assert flat["gain/keyboard/3/ttt"] == pytest.approx(0.05) and "drop/keyboard/3_ci_high" in flat
    assert flat["mce/ttt"] == pytest.approx(0.875)


def test_defense_gain_is_the_default_defense_against_none_on_the_corrupted_sets(grid):
    """`defense_gain` (issue 24): the fields of ttt_gain for evaluation.default_defense, plus its name; a method
    without mask seeds carries none; no default, no key."""
    preds, rows = grid
    stats = robustness.run_statistics(rows, preds, [0, 1], default_defense="masked_ttt", resamples=2000)
    d = stats["defense_gain"]
    assert d == {**stats["ttt_gain"], "method": "masked_ttt"}
    assert d["delta"] == pytest.approx(0.05) and d["ci_low"] > 0 and d["mask_seeds"] == [0, 1]
    spell = preds[preds["method"] == "masked_ttt"].query("mask_seed == 0").assign(method="spell", mask_seed=None)
    with_spell = pd.concat([preds, spell], ignore_index=True)
    s = robustness.run_statistics(rows, with_spell, [0, 1], default_defense="spell", resamples=2000)["defense_gain"]
    assert s["method"] == "spell" and "mask_seeds" not in s and s["delta"] == pytest.approx(0.05)
    assert "defense_gain" not in robustness.run_statistics(rows, preds, [0, 1], resamples=2000)
    flat = robustness.flat_metrics({"defense_gain": s})
    assert flat["defense_gain"] == pytest.approx(0.05) and flat["defense_gain_ci_low"] == s["ci_low"]
    assert "defense_gain" in robustness.CONTRACT
