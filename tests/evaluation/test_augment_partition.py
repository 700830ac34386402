"""Robust training's report: families trained on apart from held-out ones; the recovered-fraction interval."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ttt_pipeline.evaluation import robustness
from ttt_pipeline.evaluation.stats import recovered_fraction_interval

N = 200


def frame(set_name, kind, family, method, correct, seed=None):
    correct = np.asarray(correct)
    return pd.DataFrame({"kind": kind, "set": set_name, "family": family, "severity": 3 if family else None,
                         "method": method, "mask_seed": seed, "index": range(N), "label": 0,
                         "pred": np.where(correct == 1, 0, 1)})


@pytest.fixture()
def preds():
    ones = np.ones(N, int)
    rows = [frame("clean", "clean", None, "none", ones), frame("clean", "clean", None, "spell", ones)]
    # trained-on family: drop 0.1, spell wins 0.05 back; held-out: drop 0.3, spell wins nothing
    def first_wrong(k):
        return np.r_[np.zeros(k, int), np.ones(N - k, int)]

    for name, fam, wrong_none, wrong_spell in (("keyboard-3", "keyboard", 20, 10), ("word_swap-3", "word_swap", 60, 60)):
        rows.append(frame(name, "corrupted", fam, "none", first_wrong(wrong_none)))
        rows.append(frame(name, "corrupted", fam, "spell", first_wrong(wrong_spell)))
    out = pd.concat(rows, ignore_index=True)
    out["severity"] = out["severity"].astype("Int64")
    out["mask_seed"] = out["mask_seed"].astype("Int64")
    return out


def test_trained_and_held_out_families_are_reported_apart(preds):
    part = robustness.augment_partition(preds, ["keyboard", "tutorial"], resamples=2000)
    t, h = part["trained"], part["held_out"]
    assert t["families"] == ["keyboard"] and t["sets"] == ["keyboard-3"]
    assert h["families"] == ["word_swap"] and h["sets"] == ["word_swap-3"]
    assert t["corruption_drop"]["delta"] == pytest.approx(0.10) and h["corruption_drop"]["delta"] == pytest.approx(0.30)
    assert t["acc"] == pytest.approx({"none": 0.90, "spell": 0.95})
    assert h["acc"] == pytest.approx({"none": 0.7, "spell": 0.7})
    assert t["gains"]["spell"]["delta"] == pytest.approx(0.05) and t["gains"]["spell"]["significant"]
    assert h["gains"]["spell"]["delta"] == 0 and not h["gains"]["spell"]["significant"]


def test_run_statistics_carries_the_partition_only_with_augment(preds):
    rows = [{"kind": k, "set": s, "family": f, "severity": 3 if f else None, "method": m, "acc": a, "mask_seed": None}
            for k, s, f, m, a in (("clean", "clean", None, "none", 1.0), ("clean", "clean", None, "spell", 1.0),
                                  ("corrupted", "keyboard-3", "keyboard", "none", 0.9),
                                  ("corrupted", "keyboard-3", "keyboard", "spell", 0.95),
                                  ("corrupted", "word_swap-3", "word_swap", "none", 0.7),
                                  ("corrupted", "word_swap-3", "word_swap", "spell", 0.7))]
    assert "augment_families" not in robustness.run_statistics(rows, preds, [0], resamples=2000)
    stats = robustness.run_statistics(rows, preds, [0], augment_families=["keyboard"], resamples=2000)
    assert set(stats["augment_families"]) == {"trained", "held_out"} and "augment_families" in robustness.CONTRACT
    flat = robustness.flat_metrics(stats)
    assert flat["augment/trained/drop"] == pytest.approx(0.10) and flat["augment/held_out/drop"] == pytest.approx(0.30)
    assert flat["augment/trained/gain/spell"] == pytest.approx(0.05) and "augment/held_out/gain/spell_ci_low" in flat
    only_trained = robustness.augment_partition(preds, ["keyboard", "word_swap"], resamples=2000)
    assert set(only_trained) == {"trained"}


def test_recovered_fraction_interval():
    rng = np.random.default_rng(0)
    clean = np.ones(400)
    corrupted = (rng.random(400) > 0.2).astype(float)  # about 80 reviews broken
    broken = np.flatnonzero(corrupted == 0)
    defended = corrupted.copy()
    defended[broken[: len(broken) // 2]] = 1  # half of them fixed
    point, lo, hi = recovered_fraction_interval(clean, corrupted, defended)
    assert point == pytest.approx((len(broken) // 2) / len(broken))
    assert lo < point < hi and hi - lo < 0.4
    # draws (mask seeds) are averaged per review first: two identical draws give the same answer
    assert recovered_fraction_interval(clean, corrupted, np.c_[defended, defended]) == (point, lo, hi)
    # no drop: undefined
    assert all(np.isnan(recovered_fraction_interval(clean, clean, clean)))
    # everything won back, nothing broken elsewhere: exactly 1
    assert recovered_fraction_interval(clean, corrupted, clean) == (1.0, 1.0, 1.0)
