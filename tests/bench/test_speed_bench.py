"""bench/speed.py --quick on the shipped demo reviews: every figure of issue 37 from one run, each against its
reference of the same run, with the machine it was measured on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPREAD = {"median", "min", "max", "n"}


@pytest.mark.slow
def test_quick_speed_bench_reports_every_figure_with_its_reference(tmp_path, tiny_bench_model):
    env = {k: v for k, v in os.environ.items() if k != "TTT_CPU_NATIVE_BF16"}  # the bench asks the real CPU
    env["TTT_BENCH_MODEL"] = str(tiny_bench_model)  # both recipes and the served model on the tiny random BERT
    proc = subprocess.run([sys.executable, "-m", "bench.speed", "--quick", "--demo", "--json"],
                          capture_output=True, text=True, timeout=900, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (tmp_path / "stdout.txt").write_text(proc.stdout)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["model"] == out["settings"]["model"] == str(tiny_bench_model)
    assert out["source"] == "demo" and out["train"] == 64 and out["test"] == 48
    rates = out["train_samples_per_s"]
    assert out["finetune_speedup"] == pytest.approx(rates["recipe"] / rates["tutorial"], rel=1e-2)
    d = out["clean_delta"]
    assert d["ci_low"] <= d["delta"] <= d["ci_high"] and d["n"] == 48
    assert d["delta"] == pytest.approx(out["clean_acc"]["recipe"] - out["clean_acc"]["tutorial"])
    for key in ("ttt_fraction_of_limit", "ttt_reviews_per_s", "predict_reviews_per_s", "repair_reviews_per_s",
                "spell_overhead", "spell_overhead_repair_alone"):
        assert set(out[key]) == SPREAD and out[key]["n"] == 2, key
        assert out[key]["min"] <= out[key]["median"] <= out[key]["max"], key
    # TTT adapts and predicts: slower than plain prediction, and its limit is a quarter of that
    assert 0 < out["ttt_reviews_per_s"]["median"] < out["predict_reviews_per_s"]["median"]
    assert 0 < out["ttt_fraction_of_limit"]["median"] < 2
    assert out["repair_reviews_per_s"]["median"] > 0 and out["spell_overhead"]["median"] > -0.5
    # the repair's time over the model's, each repeat: bounded by the two rates' extremes
    model, repair, share = (out[k] for k in ("predict_reviews_per_s", "repair_reviews_per_s",
                                             "spell_overhead_repair_alone"))
    assert 0.98 * model["min"] / repair["max"] <= share["min"]
    assert share["max"] <= 1.02 * model["max"] / repair["min"]
    assert 0 < out["serve_p50_ms"] <= out["serve_p95_ms"] and out["serve_requests"] == 20
    assert 0 < out["serve_fp32_p50_ms"] <= out["serve_fp32_p95_ms"]
    assert out["serve_p50_speedup"] == pytest.approx(out["serve_fp32_p50_ms"] / out["serve_p50_ms"], rel=0.02)
    step = out["training_step"]
    assert {"before", "after"} <= set(step["arms"]) and step["gflop_per_sample"] > 0
    for name, arm in step["arms"].items():
        assert arm["samples_per_s"] == pytest.approx(step["batch"][0] / arm["step_ms"] * 1000, rel=0.02), name
    assert step["speedup_over_before"]["after"] == pytest.approx(
        step["arms"]["before"]["step_ms"] / step["arms"]["after"]["step_ms"], rel=0.02)
    for profile in (step["profile_step"], step["profile_scoring"]):
        shares = {k: v for k, v in profile.items() if k != "total_ms"}
        assert profile["total_ms"] > 0 and sum(shares.values()) == pytest.approx(1, abs=0.01)
    assert {"matrix products", "optimizer"} <= set(step["profile_step"])
    assert "optimizer" not in step["profile_scoring"]
    assert out["serve_method"] == "spell"
    assert set(out["peak_rss_mb"]) == {"finetune_tutorial", "finetune", "predict", "masked_ttt"}
    check = out["precision_check"]
    assert set(check["bf16_over_fp32"]) == SPREAD and check["auto_picks"] == out["precision"]
    machine = out["machine"]
    if not machine["native_bf16"]:  # emulated bf16 is many times slower: auto must have picked fp32
        assert check["auto_picks"] == "fp32" and check["bf16_over_fp32"]["median"] > 2 and check["auto_picks_faster"]
    assert machine["cpu_capability"] and machine["threads"] >= 1 and isinstance(machine["native_bf16"], bool)
    assert out["precision"] == ("bf16" if machine["native_bf16"] else "fp32")
    roof = out["roofline"]
    assert 8 <= roof["recipe"]["width"] <= 128  # the demo preset's model.max_length
    for name in ("tutorial", "recipe"):
        assert roof[name]["gflop_per_sample"] > 0
        assert roof[name]["gflops"] == pytest.approx(rates[name] * roof[name]["gflop_per_sample"], rel=0.02)
    gemm = roof["gemm_gflops"]["bfloat16" if out["precision"] == "bf16" else "float32"]
    assert out["finetune_speedup_ceiling"] == pytest.approx(
        gemm / roof["recipe"]["gflop_per_sample"] / rates["tutorial"], rel=0.02)


def test_flop_count_of_a_linear_layer_is_its_three_products(speed_bench):
    """Forward, input gradient and weight gradient: 3 x 2 x in x out FLOPs per row (the bias adds none)."""
    import torch

    layer, x = torch.nn.Linear(384, 1536), torch.randn(8, 384, requires_grad=True)
    assert speed_bench.train_gflop_per_sample(layer, lambda: layer(x).sum(), 8) == pytest.approx(
        3 * 2 * 384 * 1536 / 1e9)
    assert layer.weight.grad is None  # dropped after counting


def test_roofline_ceiling_is_the_recipe_at_the_gemm_rate_over_the_tutorial(speed_bench, monkeypatch):
    monkeypatch.setattr(speed_bench, "gemm_gflops", lambda dtype, device: 160.0 if dtype.is_floating_point else 0)
    figures = {"train_samples_per_s": {"tutorial": 12.0, "recipe": 22.0}, "precision": "fp32"}
    out, ceiling = speed_bench.roofline(11.6, {"gflop_per_sample": 7.1, "width": 96},
                                        figures, type("A", (), {"device": "cpu"})())
    assert out["gemm_gflops"] == {"float32": 160.0}
    assert out["tutorial"] == {"gflop_per_sample": 11.6, "gflops": 139.2, "of_gemm": 0.87}
    assert out["recipe"] == {"gflop_per_sample": 7.1, "gflops": 156.2, "of_gemm": 0.976, "width": 96}
    assert ceiling == pytest.approx(160 / 7.1 / 12.0, abs=0.01)  # 1.88: 4x needs less arithmetic
