"""bench/own_model.py --quick on the tiny random BERT: a user's classifier fine-tuned with a plain PyTorch loop,
evaluated from its folder and from the MLflow registry (the same figures), and the evaluate grid's speed against
the forward passes it needs. The figures of a random model mean nothing; the contract and the arithmetic do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MDSD = (REPO.parent / "shared" / "data" / "mdsd").resolve()


@pytest.mark.slow
@pytest.mark.skipif(not (MDSD / "electronics").is_dir(), reason=f"MDSD reviews not found at {MDSD}")
def test_quick_own_model_bench_evaluates_both_forms_alike_and_splits_its_time(tmp_path, tiny_bench_env):
    proc = subprocess.run([sys.executable, "-m", "bench.own_model", "--quick", "--work", str(tmp_path)],
                          capture_output=True, text=True, timeout=1500, cwd=REPO,
                          env={**tiny_bench_env, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["train_reviews"] == 48 and out["test_reviews"] == 40 and out["same_figures"]
    folder, registry = out["from_folder"], out["from_registry"]
    assert folder["model_name"].endswith("-byo-minilm") and registry["model_name"].endswith("-byo-minilm")
    gain = folder["defense_gain"]
    assert gain["method"] == "spell" and gain["ci_low"] <= gain["delta"] <= gain["ci_high"]
    assert "masked_ttt" in folder["notes"][0]  # the user's model has no MLM head
    s = out["speed"]
    assert s["methods"] == ["none", "spell", "mask_ensemble"] and s["reviews"] == 40
    assert s["evaluate_fraction_of_limit"] == pytest.approx(s["forward_limit_s"] / s["evaluate_wall_s"], abs=2e-3)
    assert s["other_s"] == pytest.approx(s["evaluate_wall_s"] - s["forward_limit_s"] - s["repair_s"], abs=0.02)
