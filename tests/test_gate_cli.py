"""`evaluate --fail-if` through the CLI, the flow replaced by a canned summary: a malformed rule stops before any
work (exit 2), a rule that holds exits 3 and one that does not 0, the job summary goes to $GITHUB_STEP_SUMMARY
(appended) or --gate-summary, and --json's last line carries the gate's outcome."""

from __future__ import annotations

import json

import pytest

from ttt_pipeline.cli import main as cli_main


@pytest.fixture
def canned(monkeypatch, tmp_path):
    from ttt_pipeline.flows import evaluate_model as flow

    calls = []
    summary = {"acc_clean": 0.9, "acc_corrupted": 0.75, "acc_default": 0.85,
               "corruption_drop": {"delta": 0.15, "ci_low": 0.09, "ci_high": 0.21, "p_mcnemar": 0.01, "helped": 3,
                                   "hurt": 1, "significant": True, "n": 129},
               "gains": {}, "cached_tasks": 0, "cached": {}, "wall_s": 1.0, "mlflow_run_id": "r1",
               "mlflow_tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    monkeypatch.setattr(cli_main, "preflight_model", lambda cfg: calls.append("preflight") or _Data())
    monkeypatch.setattr(cli_main, "start_prefect_server", lambda: None)
    monkeypatch.setattr(flow, "evaluate_model", lambda config: dict(summary))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    return calls


class _Data:
    meta = {}


def _evaluate(*args):
    return cli_main.main(["evaluate", "--model", "some/model", "--json", *args])


def test_a_malformed_rule_stops_before_any_work(canned, capsys):
    assert _evaluate("--fail-if", "drop >> 3") == 2
    assert canned == [] and "error: gate rule 'drop >> 3'" in capsys.readouterr().err


def test_a_rule_that_holds_exits_3_and_writes_the_step_summary(canned, capsys, tmp_path, monkeypatch):
    step = tmp_path / "step.md"
    step.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    assert _evaluate("--fail-if", "drop.ci_low > 3pt", "--fail-if", "acc_clean < 0.5") == 3
    out = capsys.readouterr().out
    assert "gate: HOLDS: drop.ci_low > 3pt  (corruption_drop_ci_low = 0.09)" in out
    gate = json.loads(out.strip().splitlines()[-1])["gate"]
    assert gate["held"] == ["drop.ci_low > 3pt"] and not gate["passed"] and gate["summary"] == str(step)
    text = step.read_text()
    assert text.startswith("earlier step\n## ttt-pipeline gate: failed: 1 of 2 rules hold")


def test_no_rule_holds_exits_0_and_the_summary_goes_to_the_named_file(canned, capsys, tmp_path):
    assert _evaluate("--fail-if", "drop.ci_low > 30pt", "--gate-summary", "out/gate.md") == 0
    assert (tmp_path / "out" / "gate.md").read_text().startswith("## ttt-pipeline gate: passed")
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["gate"]["passed"]


def test_without_rules_no_summary_is_written(canned, capsys, tmp_path):
    assert _evaluate() == 0
    assert "gate" not in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert not (tmp_path / "gate-summary.md").exists()
