"""bench/accuracy.py --quick: the JSON contract the closing notes and dashboards read (real MDSD reviews; the tiny
random BERT as the encoder, tests/bench/conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KEYS = ["train_samples_per_s", "acc_clean", "acc_corrupted", "acc_ttt", "recovered_fraction", "acc_clean_ttt",
        "acc_shift", "acc_shift_ttt"]
DIFF = {"delta", "ci_low", "ci_high", "p_mcnemar", "helped", "hurt", "significant"}


def check_difference(d: dict, mask_seeds=None, has_mask_seeds: bool = True) -> None:
    """One paired-difference object of the JSON contract (ttt_pipeline.evaluation.stats.paired_difference's fields)."""
    assert DIFF <= set(d), d
    assert ("mask_seeds" in d) == has_mask_seeds, d
    if has_mask_seeds:
        assert d["mask_seeds"] == mask_seeds, d
    assert d["ci_low"] <= d["delta"] + 1e-12 and d["delta"] <= d["ci_high"] + 1e-12, d
    assert -1.0 <= d["ci_low"] and d["ci_high"] <= 1.0, d
    assert d["significant"] == (d["ci_low"] > 0 or d["ci_high"] < 0), d
    assert isinstance(d["helped"], int) and isinstance(d["hurt"], int), d
    assert d["helped"] >= 0 and d["hurt"] >= 0 and d["helped"] + d["hurt"] <= d["n"], d
    assert 0.0 <= d["p_mcnemar"] <= 1.0, d
    assert isinstance(d["significant"], bool), d
    assert not any(isinstance(v, list) and len(v) > 3 for v in d.values()), d  # no per-review vectors


def check_intervals(summary: dict, mask_seeds, shift: bool = True, drop: bool = True) -> None:
    """ttt_gain / ttt_clean_change / ttt_shift_change (with mask_seeds) and corruption_drop (without)."""
    for key in ("ttt_gain", "ttt_clean_change"):
        check_difference(summary[key], mask_seeds)
    if shift:
        assert set(summary["ttt_shift_change"]) == {"kitchen", "books"}
        for d in summary["ttt_shift_change"].values():
            check_difference(d, mask_seeds)
    if drop:
        check_difference(summary["corruption_drop"], has_mask_seeds=False)
    else:
        assert "corruption_drop" not in summary  # the trained model's, not its TTT settings'


@pytest.mark.slow
@pytest.mark.mdsd
def test_quick_bench_reports_both_recipes(mdsd_dir, tmp_path, tiny_bench_model, tiny_bench_env):
    proc = subprocess.run([sys.executable, "-m", "bench.accuracy", "--quick", "--json", "--threads", "2",
                           "--finetune", "joint_passes=1", "--ttt-alternatives", "lr=1e-5,params=layernorm"],
                          capture_output=True, text=True, timeout=900, cwd=REPO, env=tiny_bench_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (tmp_path / "stdout.txt").write_text(proc.stdout)  # kept by pytest: the table and the JSON, to read after
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["model"] == str(tiny_bench_model)  # the tiny random BERT (tests/bench/conftest.py), never MiniLM
    assert out["ours_mode"] == "joint" and out["settings"]["quick"] is True
    assert out["settings"]["finetune"] == {"joint_passes": 1}
    for side in ("tutorial", "ours"):
        for k in KEYS:
            assert k in out[side], (side, k)
            v = out[side][k]
            if k == "recovered_fraction" and v is None:  # no drop on 32 reviews: undefined, reported as null
                continue
            assert isinstance(v, float), (side, k, v)
            if k.startswith("acc_"):
                assert 0.0 <= v <= 1.0, (side, k, v)
        assert out[side]["train_samples_per_s"] > 0
        assert len(out[side]["per_seed"]) == 1
    # paired 95% intervals: ours pooled over the training seeds and mask seeds 0..2, the tutorial one draw
    assert out["settings"]["mask_seeds"] == [0, 1, 2]
    check_intervals(out["ours"], [0, 1, 2])
    check_intervals(out["tutorial"], None)
    check_intervals(out["modes"]["ours/joint"], [0, 1, 2])
    check_intervals(out["modes"]["tutorial"], None)
    check_intervals(out["ours"]["per_seed"][0], [0, 1, 2])
    assert out["ours"]["ttt_gain"]["n"] == out["settings"]["test"] == 32
    # one trained model: the pooled gain is that model's, pooled over its mask seeds
    assert out["ours"]["ttt_gain"] == out["ours"]["per_seed"][0]["ttt_gain"]
    by_seed = out["ours"]["per_seed"][0]["acc_ttt_by_mask_seed"]
    assert len(by_seed) == 3 and out["ours"]["acc_ttt"] == pytest.approx(sum(by_seed) / 3)  # mean over mask seeds
    g = out["ours"]["ttt_gain"]
    assert g["delta"] == pytest.approx(out["ours"]["acc_ttt"] - out["ours"]["acc_corrupted"])
    for side in ("ours", "tutorial"):
        r = out[side]
        assert r["corruption_drop"]["delta"] == pytest.approx(r["acc_clean"] - r["acc_corrupted"])
        assert r["ttt_gain"]["delta"] == pytest.approx(r["acc_ttt"] - r["acc_corrupted"])
        assert r["ttt_clean_change"]["delta"] == pytest.approx(r["acc_clean_ttt"] - r["acc_clean"])
    # the table prints the gain in points with its interval and verdict
    from ttt_pipeline.evaluation.stats import format_difference

    assert format_difference(g) in proc.stdout
    alt = out["ours"]["ttt_alternatives"]["lr=1e-5,params=layernorm"]  # same trained model, other TTT settings
    assert 0.0 <= alt["acc_ttt"] <= 1.0 and 0.0 <= alt["acc_clean_ttt"] <= 1.0
    check_intervals(alt, [0, 1, 2], drop=False)
    assert len(json.dumps(out)) < 60_000  # no per-review vectors in the printed JSON
    # the per-seed progress line (stderr) carries the whole seed's result, alternatives included, so a long run's
    # figures can be read before it ends
    prefix = "[bench] ours/joint seed 42: "
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith(prefix))
    assert json.loads(line[len(prefix):]) == out["ours"]["per_seed"][0]
    assert out["train_speedup"] == pytest.approx(out["ours"]["train_samples_per_s"] / out["tutorial"]["train_samples_per_s"])


@pytest.mark.slow
@pytest.mark.mdsd
def test_quick_bench_chooses_ttt_settings_on_the_held_out_selection_set(mdsd_dir, tiny_bench_model, tiny_bench_env):
    proc = subprocess.run([sys.executable, "-m", "bench.accuracy", "--quick", "--json", "--threads", "2",
                           "--skip-tutorial", "--select-ttt", "--selection-size", "8",
                           "--ttt-alternatives", "mask_prob=0.3"],
                          capture_output=True, text=True, timeout=900, cwd=REPO, env=tiny_bench_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["model"] == str(tiny_bench_model)
    assert out["settings"]["selection_texts"] == 16 and out["settings"]["select_ttt"] is True
    run = out["ours"]["per_seed"][0]
    scores = run["selection_ttt"]
    assert set(scores) == {"default", "mask_prob=0.3"}
    # the chosen settings are the best on the selection set, the default winning ties
    best = max(scores.values())
    assert run["ttt_selected"] == next(n for n in ("default", "mask_prob=0.3") if scores[n] == best)
    assert out["ttt_selected_per_seed"] == [run["ttt_selected"]]
    # the fixed default stays reported beside the chosen one, on the same scored sets
    default = out["ours"]["ttt_alternatives"]["default"]
    assert set(out["ours"]["ttt_alternatives"]) == {"default"}
    if run["ttt_selected"] == "default":
        assert default["acc_ttt"] == run["acc_ttt"]
    for k in ("acc_ttt", "acc_clean_ttt", "acc_shift_ttt"):
        assert 0.0 <= default[k] <= 1.0
    check_intervals(out["ours"], [0, 1, 2])
    check_intervals(default, [0, 1, 2], drop=False)
    if run["ttt_selected"] == "default":
        assert default["ttt_gain"] == out["ours"]["ttt_gain"]


def test_select_ttt_without_a_selection_set_fails_naming_the_flag():
    proc = subprocess.run([sys.executable, "-m", "bench.accuracy", "--select-ttt"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2 and "--selection-size" in proc.stderr


def test_mask_seeds_must_be_positive():
    proc = subprocess.run([sys.executable, "-m", "bench.accuracy", "--mask-seeds", "0"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2 and "--mask-seeds" in proc.stderr
