"""docs/operations.md's "Watch your own model nightly": its deployment is one Prefect accepts, of the flow the
shipped nightly deployment runs, with parameters that flow takes; it watches the very model `evaluate --model`
registered; its terminal line is the one evaluate's summary prints."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")


def recipe() -> tuple[str, str]:
    """(the section's text, its YAML block)."""
    section = DOC.split("### Watch your own model nightly", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```yaml\n(.*?)```", section, re.S)
    return section, block


def test_the_deployment_runs_the_shipped_nightly_flow_with_its_parameters():
    from prefect.client.schemas.schedules import CronSchedule

    from ttt_pipeline.flows.reevaluate import nightly_reevaluation

    _, block = recipe()
    mine = yaml.safe_load(block)
    shipped = yaml.safe_load((REPO / "prefect.yaml").read_text())
    [nightly] = [d for d in shipped["deployments"] if d["name"] == "nightly-reevaluation"]
    [deployment] = mine["deployments"]
    assert mine["pull"] == shipped["pull"] and deployment["entrypoint"] == nightly["entrypoint"]
    assert set(deployment["parameters"]) <= set(inspect.signature(nightly_reevaluation.fn).parameters)
    assert deployment["concurrency_limit"] == nightly["concurrency_limit"]
    for schedule in deployment["schedules"]:
        CronSchedule(cron=schedule["cron"], timezone=schedule["timezone"])  # Prefect's own validation


def test_it_watches_the_model_evaluate_registered():
    """The deployment's preset and overrides give the registered name the evaluate of that model gave."""
    from ttt_pipeline.cli.main import build_parser
    from ttt_pipeline.config import flow_config, load_config

    _, block = recipe()
    params = yaml.safe_load(block)["deployments"][0]["parameters"]
    watched = flow_config(None, params["preset"], params["overrides"])
    model = params["overrides"]["model.classifier"]
    args = build_parser().parse_args(["evaluate", "--model", model, "--config", params["preset"]])
    evaluated = load_config(args.config, args.set)
    evaluated.model.classifier = args.model
    labels = ["negative", "positive"]
    assert watched.model_name(labels) == evaluated.model_name(labels)


def test_the_terminal_line_is_the_one_evaluate_prints():
    from ttt_pipeline.cli.next_steps import next_commands, rerun_arguments

    section, block = recipe()
    params = yaml.safe_load(block)["deployments"][0]["parameters"]
    registry = {"model_name": "any", "version": "1", "champion_after": "1"}
    printed = next_commands(registry, rerun_arguments(params["overrides"]["model.classifier"], params["preset"], []))
    assert f"`{printed[2]}`" in " ".join(section.split())
