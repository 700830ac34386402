"""bench/real_noise.py --quick on the tiny random BERT: both validation choices made, the test table's structure,
and every interval containing its point estimate. The figures of a random model mean nothing; the contract does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
METHODS = ("none", "spell", "spell_context", "anchored_tta", "anchored_tta_views")


def contains(d: dict) -> bool:
    return d["ci_low"] <= d["delta"] <= d["ci_high"]


@pytest.mark.slow
def test_quick_real_noise_bench_reports_paired_intervals_around_their_points(tmp_path, tiny_bench_env):
    proc = subprocess.run([sys.executable, "-m", "bench.real_noise", "--quick", "--store", str(tmp_path / "store")],
                          capture_output=True, text=True, timeout=1500, cwd=REPO,
                          env={**tiny_bench_env, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["quick"] and set(out["presets"]) == {"rt-polarity", "mdsd-electronics"}
    assert "tta - views" in proc.stderr  # the readable table
    for preset, r in out["presets"].items():
        if r.get("skipped"):
            assert preset == "mdsd-electronics" and "no data" in r["reason"]
            continue
        assert r["seeds"] == [42] and r["test_snippets"] == r["tta_test_snippets"] == 40
        sel = r["selection"]
        assert sel["severity"] == 3 and sel["validation_snippets"] == 40
        assert sel["anchored_tta"]["chosen"] == {"lr": 1e-4, "steps": 1, "views": 2}
        assert r["sets"] == ["clean", "misspelling", "tutorial", "ext:keyboard", "ext:ocr", "ext:random_char",
                             "ext:spelling"]
        assert contains(r["misspelling_drop"]) and r["misspelling_drop"]["n"] == 40
        for s in r["sets"]:
            assert set(r["accuracy"][s]) == {*METHODS, "none_tta_sample"}
            assert contains(r["tta_minus_views"][s])
            for m in METHODS[1:]:
                assert contains(r["gain_vs_none"][m][s]), (m, s)
        rf = r["recovered_fraction"]
        assert rf["method"] == r["default_defense"] == "spell"
        if rf["point"] is not None and rf["ci_low"] is not None:
            assert rf["ci_low"] <= rf["point"] <= rf["ci_high"]
