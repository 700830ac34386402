"""bench/defenses.py --quick: the JSON contract of issue 23 (real MDSD reviews)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DIFF = {"delta", "ci_low", "ci_high"}
OWN = ["tutorial-3", "keyboard-3", "word_swap-3", "misspelling-3"]  # misspelling: test reviews only
EXTERNAL = ["ext:keyboard-3", "ext:ocr-3", "ext:random_char-3", "ext:spelling-3"]
SETS = ["clean", *OWN, *EXTERNAL, "kitchen", "books"]


@pytest.mark.slow
@pytest.mark.mdsd
def test_quick_defenses_bench_contract(mdsd_dir, tiny_bench_model, tiny_bench_env, tmp_path, defenses_bench):
    defenses = ["none", "spell", "mask_ensemble", "masked_ttt", "spell+masked_ttt"]
    kept = tmp_path / "validation.npz"
    proc = subprocess.run([sys.executable, "-m", "bench.defenses", "--quick", "--json", "--threads", "2",
                           "--defenses", *defenses, "--augmented", "none", "spell",
                           "--ttt-candidates", "tutorial", "lr=1e-4", "--min-speed", "0",
                           "--keep-validation", str(kept)],
                          capture_output=True, text=True, timeout=1800, cwd=REPO, env=tiny_bench_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["model"] == str(tiny_bench_model)  # the tiny random BERT (tests/bench/conftest.py)
    names = defenses + ["augment", "augment+spell"]
    assert {(r["defense"], r["set"]) for r in out["rows"]} == {(d, s) for d in names for s in SETS}
    for r in out["rows"]:
        assert {"defense", "set", "acc", "delta", "ci_low", "ci_high", "reviews_per_s"} <= set(r)
        assert 0.0 <= r["acc"] <= 1.0 and r["ci_low"] <= r["delta"] <= r["ci_high"] and r["reviews_per_s"] > 0
        if r["defense"] == "none":
            assert r["delta"] == 0.0
        if r["defense"].startswith("augment") and r["set"].endswith("-3") and not r["set"].startswith("ext:"):
            assert r["trained_on"] == (r["set"] in ("tutorial-3", "keyboard-3"))  # word_swap is held out
    none = {r["set"]: r["acc"] for r in out["rows"] if r["defense"] == "none"}
    assert out["drop"]["delta"] == pytest.approx(none["clean"] - none["tutorial-3"]) and DIFF <= set(out["drop"])
    d = out["default"]
    assert d["name"] in names and d["name"] in d["validation"] and d["reviews_per_s"] > 0
    assert set(d["validation"]) == set(names)  # chosen on the validation split: every candidate has its scores
    assert d["rule_version"] == 3
    # the kept validation scores give the same choice and table again
    again = defenses_bench.select_default(defenses_bench.load_validation(str(kept)), names, 0.0)
    assert again["name"] == d["name"]
    for m in names:
        assert again["validation"][m] == pytest.approx(d["validation"][m])
    vs = d.get("retrained_vs_plain")  # present when version 2's pick is a retrained model and a plain one is eligible
    if vs is not None:
        assert DIFF <= set(vs) and d["name"] == (vs["retrained"] if vs["ci_low"] > 0 else vs["plain"])
    assert len(d["recovered_ci"]) == 2
    assert d["recovered_fraction"] is None or isinstance(d["recovered_fraction"], float)
    for key in ("clean_change", "shift_change"):
        assert DIFF <= set(d[key])
    assert set(d["shift_change_by_domain"]) == {"kitchen", "books"}
    for key in ("ttt_vs_control", "ttt_on_top_of_spell"):
        assert DIFF <= set(out[key]) and out[key]["sets"] == OWN  # the own suite only, never the external sets
        assert out[key]["ci_low"] <= out[key]["delta"] <= out[key]["ci_high"] and out[key]["verdict"]
    mine = {(r["defense"], r["set"]): r["acc"] for r in out["rows"]}
    assert out["ttt_vs_control"]["delta"] == pytest.approx(
        sum(mine[("masked_ttt", s)] - mine[("mask_ensemble", s)] for s in OWN) / 4)
    assert out["augment"]["held_out_sets"] == ["word_swap-3", "misspelling-3"]
    assert DIFF <= set(out["augment"]["held_out"])
    g = out["generalisation"]
    assert g["own_sets"] == OWN and g["external_sets"] == EXTERNAL
    for m in names[1:]:
        assert DIFF <= set(g["gains"][m]["own"]) and DIFF <= set(g["gains"][m]["external"])
        w = g["worst_case"][m]  # the lowest change over all 11 sets, and harm when an interval is below 0
        assert w["delta"] == pytest.approx(min(r["delta"] for r in out["rows"] if r["defense"] == m))
        assert w["harm"] == any(r["ci_high"] < 0 for r in out["rows"] if r["defense"] == m)
    assert g["default"]["name"] == d["name"]
    for m in names[1:]:  # the recovered fraction on every set and on the external sets pooled, for every defense
        assert set(OWN + EXTERNAL + ["external_pooled"]) <= set(g["fractions"][m])
        assert g["fractions"][m]["external_pooled"]["sets"] == EXTERNAL
        assert DIFF <= set(g["fractions"][m]["misspelling-3"]["drop"])
    run = out["per_seed"][0]
    assert run["ttt_selected"] in ("tutorial", "lr=1e-4") and set(run["ttt_validation"]) == {"tutorial", "lr=1e-4"}
    assert run["train_augment"]["augment"]["n_copies"] == 24  # half of the 48 quick training reviews
    assert out["settings"]["quick"] is True and out["estimated_full_run_s"] > 0

