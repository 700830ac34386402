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


@pytest.mark.slow
def test_quick_serve_load_reports_latencies_and_no_mismatch(make_tiny_clf, tmp_path):
    from ttt_pipeline.classifier import inference_config
    from ttt_pipeline.io.mlflow_model import save_classifier_model
    from ttt_pipeline.modeling.model import save_model

    model, tok = make_tiny_clf(("negative", "positive"))
    folder = save_model(model, tok, tmp_path / "model")
    served = save_classifier_model(folder, tmp_path / "mlflow-model", inference_config(method="spell"))
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "bench.serve_load", "--model", str(served), "--requests", "4",
                           "--clients", "2", "--methods", "default", "masked_ttt", "--json"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out["methods"]) == {"default", "masked_ttt"} and out["machine"]["threads"] >= 1
    for name, m in out["methods"].items():
        assert m["requests"] == 4 and m["clients"] == 2 and m["mismatches"] == 0, name
        assert 0 < m["p50_ms"] <= m["p95_ms"] <= m["max_ms"] and m["requests_per_s"] > 0, name
