"""The documented pull-request workflow (docs/operations.md, "Gating a pull request"): valid YAML whose command is
one `ttt-pipeline evaluate` the parser accepts, with rules the gate parses."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from ttt_pipeline.cli.main import build_parser
from ttt_pipeline.evaluation.gate import parse_rule

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_the_documented_workflow_runs_a_command_the_cli_and_the_gate_accept():
    section = DOC.read_text().split("## Gating a pull request", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```yaml\n(.*?)```", section, re.S)
    workflow = yaml.safe_load(block)
    steps = workflow["jobs"]["gate"]["steps"]
    [command] = [s["run"] for s in steps if "ttt-pipeline evaluate" in s.get("run", "")]
    argv = shlex.split(command)
    assert argv[0] == ".venv/bin/ttt-pipeline"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "evaluate" and args.fail_if == ["drop.ci_low > 3pt", "harm/default"]
    rules = [parse_rule(r) for r in args.fail_if]
    assert [(r.figure, r.op, r.value) for r in rules] == [("corruption_drop_ci_low", ">", 0.03),
                                                          ("harm/default", None, None)]
