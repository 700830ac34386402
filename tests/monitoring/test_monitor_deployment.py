"""The `traffic-monitor` deployment as prefect.yaml declares it: hourly in UTC, one run at a time, parameters the
flow accepts (the demo preset, read when the run starts), no retries."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_the_deployment_is_hourly_in_utc_with_a_concurrency_limit_of_one():
    from prefect.cli.deploy._models import PrefectYamlModel
    from prefect.client.schemas.objects import ConcurrencyLimitConfig
    from prefect.client.schemas.schedules import CronSchedule

    raw = yaml.safe_load((REPO / "prefect.yaml").read_text())
    doc = PrefectYamlModel.model_validate(raw)
    dep = {d.name: d for d in doc.deployments}["traffic-monitor"]
    assert dep.entrypoint == "ttt_pipeline.flows.monitor.traffic_monitor" and dep.work_pool.name == "cpu"
    (sched,) = dep.schedules
    assert sched.active is True and sched.cron == "0 * * * *" and sched.timezone == "UTC"
    CronSchedule(cron=sched.cron, timezone=sched.timezone)
    limit = ConcurrencyLimitConfig.model_validate(dep.concurrency_limit.model_dump(exclude_none=True))
    assert limit.limit == 1 and limit.collision_strategy.value == "CANCEL_NEW"


def test_its_parameters_are_the_flows_and_resolve_to_the_demo_preset():
    from ttt_pipeline.config import flow_config, load_config
    from ttt_pipeline.flows.monitor import traffic_monitor

    raw = {d["name"]: d for d in yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]}
    params = traffic_monitor.validate_parameters(raw["traffic-monitor"]["parameters"])
    assert params["preset"] == "demo" and params["overrides"] == {}
    cfg = flow_config(params.get("config"), params["preset"], params["overrides"])
    assert cfg == load_config("demo") and cfg.monitoring.window == "24h" and not cfg.monitoring.capture
    assert traffic_monitor.retries == 0 and traffic_monitor.name == "traffic-monitor"
    assert "demo" in traffic_monitor.fn.__doc__  # the form's help names the presets
