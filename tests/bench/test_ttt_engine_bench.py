"""bench/ttt_engine.py --quick: every engine's TTT gain carries a paired interval pooled over mask seeds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_accuracy_bench import check_difference  # noqa: E402

ENGINES = {"reference": "acc_reference_ttt", "ours_same": "acc_ours_same", "ours_best": "acc_best",
           "ours_selected": "acc_selected"}


@pytest.mark.slow
@pytest.mark.mdsd
def test_quick_engine_bench_reports_paired_gains(mdsd_dir, tmp_path, tiny_bench_model, tiny_bench_env):
    proc = subprocess.run([sys.executable, "-m", "bench.ttt_engine", "--quick", "--json", "--no-rss"],
                          capture_output=True, text=True, timeout=1200, cwd=REPO, env=tiny_bench_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (tmp_path / "stdout.txt").write_text(proc.stdout)  # kept by pytest: the JSON, to read after
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["model"] == str(tiny_bench_model)  # the tiny random BERT (tests/bench/conftest.py), its own cache
    assert out["mask_seeds"] == [0, 1, 2] and out["quick"] is True
    assert out["predictions_compared"] == out["n_test"] * 3
    assert set(out["ttt_gain"]) == set(ENGINES)
    for engine, key in ENGINES.items():
        g = out["ttt_gain"][engine]
        check_difference(g, [0, 1, 2])
        assert g["n"] == out["n_test"]
        # the gain is the mean-over-mask-seeds accuracy minus the plain one on the same reviews
        assert g["delta"] == pytest.approx(out[key] - out["acc_corrupted"])
        by_seed = out["acc_by_mask_seed"][engine]
        assert len(by_seed) == 3 and out[key] == pytest.approx(sum(by_seed) / 3)
    check_difference(out["corruption_drop"], has_mask_seeds=False)
    assert out["corruption_drop"]["delta"] == pytest.approx(out["acc_clean"] - out["acc_corrupted"])
    # same settings, same injected masks on every mask seed: ours reproduces the reference
    assert out["max_abs_logit_diff"] < 1e-3
    assert out["weights_unchanged"] is True
    assert "ttt gain reference: " in proc.stderr
