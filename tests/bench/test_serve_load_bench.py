"""bench/serve_load.py's smoke run: a tiny classifier's MLflow Model served by `mlflow models serve`, a few bodies
alone and then from two concurrent clients, per method; the JSON's figures are consistent and no answer differs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def serve_load(make_tiny_clf, tmp_path: Path, *args: str) -> dict:
    """`python -m bench.serve_load --model M ARGS --json` on a tiny `spell` classifier's MLflow Model: its JSON."""
    from ttt_pipeline.classifier import inference_config
    from ttt_pipeline.io.mlflow_model import save_classifier_model
    from ttt_pipeline.modeling.model import save_model

    model, tok = make_tiny_clf(("negative", "positive"))
    folder = save_model(model, tok, tmp_path / "model")
    served = save_classifier_model(folder, tmp_path / "mlflow-model", inference_config(method="spell"))
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "bench.serve_load", "--model", str(served), *args, "--json"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_quick_serve_load_reports_latencies_and_no_mismatch(make_tiny_clf, tmp_path):
    out = serve_load(make_tiny_clf, tmp_path, "--requests", "4", "--clients", "2", "--methods", "default",
                     "masked_ttt")
    assert set(out["methods"]) == {"default", "masked_ttt"} and out["machine"]["threads"] >= 1
    for name, m in out["methods"].items():
        assert m["requests"] == 4 and m["clients"] == 2 and m["mismatches"] == 0, name
        assert 0 < m["p50_ms"] <= m["p95_ms"] <= m["max_ms"] and m["requests_per_s"] > 0, name


@pytest.mark.slow
def test_capture_cost_compares_two_servers_and_counts_every_captured_review(make_tiny_clf, tmp_path):
    """--capture-cost: capture off and on answer the same labels, and the captured server records each review it
    was sent (the rounds' bodies hold one to three reviews)."""
    cap = serve_load(make_tiny_clf, tmp_path, "--requests", "6", "--clients", "2", "--rounds", "2",
                     "--capture-cost")["capture"]
    assert cap["off"]["requests"] == cap["on"]["requests"] == 12 and cap["label_mismatches"] == 0
    # 6 bodies of 1, 2, 3, 1, 2, 3 reviews, 2 rounds, plus the 5 warm-up bodies' 9 reviews
    assert cap["reviews_sent"] == 24 and cap["records_written"] == 24 + 9
    assert cap["p95_ratio"] == round(cap["on"]["p95_ms"] / cap["off"]["p95_ms"], 3)


@pytest.mark.slow
def test_sweep_reports_the_limit_and_each_setting_as_a_fraction_of_it(make_tiny_clf, tmp_path):
    """--sweep: the in-process scoring limit, then batching off and on at each client count, every answer equal to
    the body's lone answer, and served_fraction_of_limit the served rate over the limit."""
    out = serve_load(make_tiny_clf, tmp_path, "--requests", "6", "--sweep", "--sweep-clients", "1", "3")["sweep"]
    assert out["limit"]["reviews"] == 256 and out["limit"]["reviews_per_s"] > 0
    assert set(out["settings"]) == {f"batching_{b}_clients_{c}" for b in ("off", "on") for c in (1, 3)}
    for name, row in out["settings"].items():
        # two rounds an arm of six bodies of 1, 2, 3, 1, 2, 3 reviews
        assert row["rounds"] == 2 and row["reviews"] == 24 and row["requests"] == 12 and row["mismatches"] == 0, name
        assert row["served_fraction_of_limit"] == pytest.approx(
            row["reviews_per_s"] / out["limit"]["reviews_per_s"], abs=1e-3), name
