"""bench/traffic_forecast.py --quick on the tiny random BERT: the windows of every group, each with a forecast
interval around its point and finite figures, and the summary (coverage, MAE, baselines' MAE, false alarms)
recomputed from the windows listed. A random model's figures mean nothing; the contract does."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BASELINES = ("ac", "doc", "atc")


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def mae(rows: list[dict], key) -> float:
    return 100 * sum(abs(key(r) - r["measured"]) for r in rows) / len(rows)


@pytest.fixture(scope="module")
def quick(tmp_path_factory, tiny_bench_env) -> tuple[dict, str]:
    store = tmp_path_factory.mktemp("traffic-forecast") / "store"
    proc = subprocess.run([sys.executable, "-m", "bench.traffic_forecast", "--quick", "--store", str(store)],
                          capture_output=True, text=True, timeout=1500, cwd=REPO,
                          env={**tiny_bench_env, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.slow
def test_quick_bench_lists_every_window_with_finite_figures(quick):
    out, stderr = quick
    assert out["quick"] and out["preset"] == "rt-polarity" and out["seed"] == 42 and out["test_sample"] == 40
    assert "90% interval" in stderr  # the readable table
    cal = out["calibration"]
    assert cal["families"] == ["keyboard", "misspelling", "tutorial"]
    assert sorted((s["family"], s["severity"]) for s in cal["sets"]) == [
        ("keyboard", 1), ("keyboard", 5), ("misspelling", 1), ("misspelling", 5), ("tutorial", 3)]
    for s in cal["sets"]:
        assert finite(s["drop"]) and math.isclose(s["drop"], cal["validation_accuracy"] - s["accuracy"])
        assert 0.0 <= s["defense_change_rate"] <= 1.0 and 0.5 <= s["mean_confidence"] <= 1.0
    rows = out["windows_list"]
    names = {r["group"]: [] for r in rows}
    for r in rows:
        names[r["group"]].append(r["window"])
    assert names == {"left_out": ["misspelling-1", "misspelling-5", "keyboard-1", "keyboard-5", "tutorial-3"],
                     "external": ["ext:spelling-3"], "clean": [f"clean-{i}" for i in range(20)],
                     "mixture": ["misspelling-5 30%", "keyboard-5 30%", "ext:spelling-3 30%"]}
    for r in rows:
        f = r["forecast"]
        assert all(finite(f[k]) for k in ("delta", "ci_low", "ci_high")) and f["ci_low"] <= f["delta"] <= f["ci_high"]
        assert finite(r["measured"]) and all(finite(r["baselines"][b]) for b in BASELINES)
        assert r["verdict"] in ("ok", "noisy") and r["inside"] == (f["ci_low"] <= r["measured"] <= f["ci_high"])
        assert r["calibration"] == (f"without {r['family']}" if r["group"] in ("left_out",) or (
            r["group"] == "mixture" and not r["family"].startswith("ext:")) else "full")
    for r in rows:
        if r["group"] == "clean":
            assert r["n"] == 20 and r["measured"] == 0.0  # a clean window against itself
        else:
            assert r["n"] == 40


@pytest.mark.slow
def test_quick_bench_summary_is_computed_from_the_windows_listed(quick):
    out, _ = quick
    rows = out["windows_list"]
    groups = {"all": rows, "left_out": [r for r in rows if r["group"] in ("left_out", "external")],
              "clean": [r for r in rows if r["group"] == "clean"],
              "mixture": [r for r in rows if r["group"] == "mixture"]}
    for g, mine in groups.items():
        assert out["windows"][g] == len(mine)
        assert out["coverage"][g] == pytest.approx(sum(r["inside"] for r in mine) / len(mine))
        assert out["mae_points"][g] == pytest.approx(mae(mine, lambda r: r["forecast"]["delta"]))
        for b in BASELINES:
            assert out["baseline_mae_points"][b][g] == pytest.approx(mae(mine, lambda r, b=b: r["baselines"][b]))
        best = min(BASELINES, key=lambda b: out["baseline_mae_points"][b][g])
        assert out["best_baseline"][g] == best
    assert out["false_alarm_rate"] == pytest.approx(
        sum(r["verdict"] == "noisy" for r in groups["clean"]) / len(groups["clean"]))
    assert out["forecast_beats_best_baseline"]["left_out"] == (
        out["mae_points"]["left_out"] < out["baseline_mae_points"][out["best_baseline"]["left_out"]]["left_out"])
    fams = {f["family"]: f for f in out["families"]}
    assert set(fams) == {"misspelling", "keyboard", "tutorial", "ext:spelling"}
    for name, f in fams.items():
        mine = [r for r in groups["left_out"] if r["family"] == name]
        assert f["windows"] == len(mine) and f["inside"] == sum(r["inside"] for r in mine)
        assert finite(f["calibration_slope"]) and f["calibration_slope"] >= 0
    assert {b["family"] for b in out["broken"]} == {n for n, f in fams.items() if f["inside"] < f["windows"]}
