"""`ttt-pipeline report` and `compare`: the headline of runs from MLflow, side by side, and clear errors."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ttt_pipeline.cli.main import main

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def fake_runs(tmp_path_factory):
    """Two pipeline runs logged by hand (no training): fast checks of the formatting and the errors."""
    from ttt_pipeline.io.tracking import Tracker

    tmp_path = tmp_path_factory.mktemp("cli")
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "cli", str(tmp_path / "mlruns"))
    ids = []
    for name, epochs, head in (("a", "1", {"acc_clean": 0.8, "acc_corrupted": 0.5, "acc_ttt": 0.6}),
                               ("b", "3", {"acc_clean": 0.9, "acc_corrupted": 0.55, "acc_ttt": 0.7})):
        rid = tracker.start(name)
        tracker.params(rid, {"finetune.epochs": epochs, "model.name": "tiny", "ttt.methods": '["none", "masked_ttt"]'})
        tracker.metrics(rid, {**head, "cached_tasks": 0, "wall_s": 12.5})
        child = tracker.start("evaluate", parent=rid)
        tracker.end(child)
        tracker.end(rid)
        ids.append((rid, child))
    return tracker.uri, ids


def test_report_prints_the_headline(capsys, fake_runs):
    uri, [(a, _), _] = fake_runs
    code, out, err = run_cli(capsys, "report", a, "--tracking-uri", uri)
    assert code == 0, err
    assert f"run {a} (a, FINISHED)" in out
    assert "clean accuracy" in out and "0.800" in out
    assert "corrupted accuracy with masked TTT" in out and "0.600" in out
    assert "finetune.epochs" in out


def test_report_json_and_child_run_resolves_to_its_pipeline_run(capsys, fake_runs):
    uri, [(a, a_child), _] = fake_runs
    code, out, _ = run_cli(capsys, "report", a_child, "--tracking-uri", uri, "--json")
    assert code == 0
    s = json.loads(out)
    assert s["run_id"] == a and s["metrics"] == {"acc_clean": 0.8, "acc_corrupted": 0.5, "acc_ttt": 0.6}
    assert s["params"]["finetune.epochs"] == "1" and s["wall_s"] == 12.5


def test_compare_side_by_side_with_differences(capsys, fake_runs):
    uri, [(a, _), (b, _)] = fake_runs
    code, out, _ = run_cli(capsys, "compare", a, b, "--tracking-uri", uri)
    assert code == 0
    assert f"A: {a} (a)" in out and f"B: {b} (b)" in out
    line = [ln for ln in out.splitlines() if ln.startswith("corrupted accuracy with masked TTT")][0]
    assert line.split()[-3:] == ["0.600", "0.700", "+0.100"]
    assert "settings that differ:" in out and "finetune.epochs" in out and "A=1  B=3" in out
    assert "model.name" not in out.split("settings that differ:")[1]  # equal settings are not listed
    code, out, _ = run_cli(capsys, "compare", a, b, "--tracking-uri", uri, "--json")
    c = json.loads(out)
    assert c["metrics"]["acc_clean"]["diff"] == pytest.approx(0.1)
    assert c["params_differing"] == {"finetune.epochs": {"a": "1", "b": "3"}}


def test_unknown_run_id_is_a_user_error(capsys, fake_runs):
    uri, _ = fake_runs
    code, out, err = run_cli(capsys, "report", "0123456789abcdef0123456789abcdef", "--tracking-uri", uri)
    assert code == 2 and out == ""
    assert "error: no MLflow run '0123456789abcdef0123456789abcdef'" in err
    assert "hint:" in err and "Traceback" not in err


def test_missing_database_is_a_user_error(capsys, tmp_path):
    code, _, err = run_cli(capsys, "report", "x", "--tracking-uri", f"sqlite:///{tmp_path}/none.db")
    assert code == 2 and "no MLflow database at" in err and "hint: run `ttt-pipeline run`" in err
    assert not (tmp_path / "none.db").exists()  # looking never creates an empty store


def test_unreachable_server_fails_fast(capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err = run_cli(capsys, "compare", "a", "b", "--tracking-uri", f"http://127.0.0.1:{port}")
    assert code == 2 and "is unreachable" in err and "hint: start the server" in err


def test_default_tracking_uri_is_the_demo_presets(monkeypatch):
    from ttt_pipeline.io.client import default_tracking_uri

    monkeypatch.delenv("TTT_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert default_tracking_uri() == "sqlite:///mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow-env:5000")  # as `source .run/env` sets it
    assert default_tracking_uri() == "http://mlflow-env:5000"
    monkeypatch.setenv("TTT_TRACKING_URI", "http://tracking:5000")
    assert default_tracking_uri() == "http://tracking:5000"


def test_commands_are_listed_in_help():
    proc = subprocess.run([sys.executable, "-m", "ttt_pipeline.cli.main", "--help"], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 0 and "report" in proc.stdout and "compare" in proc.stdout


# ----------------------------------------------------------------- two real tiny pipeline runs


@pytest.mark.slow
def test_compare_two_pipeline_runs_shows_both_and_the_champion(capsys, two_runs):
    a, b = two_runs["a"], two_runs["b"]
    code, out, err = run_cli(capsys, "compare", a["mlflow_run_id"], b["mlflow_run_id"], "--tracking-uri",
                             two_runs["uri"])
    assert code == 0, err
    assert "run-a" in out and "run-b" in out
    line = [ln for ln in out.splitlines() if ln.startswith("corrupted accuracy with masked TTT")][0]
    va, vb, diff = line.split()[-3:]
    assert float(va) == pytest.approx(a["acc_ttt"], abs=5e-4) and float(vb) == pytest.approx(b["acc_ttt"], abs=5e-4)
    assert float(diff) == pytest.approx(b["acc_ttt"] - a["acc_ttt"], abs=1e-3)
    assert "finetune.epochs" in out and "A=1  B=3" in out
    winner = "B" if b["acc_ttt"] > a["acc_ttt"] else "A"
    assert f"registry: {winner} holds the `champion` alias of tiny-review-classifier" in out
    # both runs scored the same reviews: B - A is paired, per set and method, from the stored predictions
    assert "B - A on the same reviews" in out
    code, out, _ = run_cli(capsys, "compare", a["mlflow_run_id"], b["mlflow_run_id"], "--tracking-uri",
                           two_runs["uri"], "--json")
    paired = {(d["set"], d["method"]): d for d in json.loads(out)["paired"]}
    assert set(paired) >= {("clean", "none"), ("keyboard-4", "masked_ttt"), ("tutorial-2", "none")}
    clean = paired[("clean", "none")]
    assert clean["delta"] == pytest.approx(b["acc_clean"] - a["acc_clean"])
    assert clean["ci_low"] <= clean["delta"] <= clean["ci_high"]
    assert clean["significant"] == (clean["ci_low"] > 0 or clean["ci_high"] < 0)

    code, out, _ = run_cli(capsys, "report", b["mlflow_run_id"], "--tracking-uri", two_runs["uri"], "--json")
    s = json.loads(out)
    assert s["registry"]["version"] == "2" and s["registry"]["is_champion"] is (winner == "B")
    assert s["metrics"]["acc_clean"] == pytest.approx(b["acc_clean"])
