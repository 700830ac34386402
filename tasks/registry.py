"""The registry task: register the run's model and move the `champion` alias when it wins (see
`ttt_pipeline.io.registry` for what is registered and how the decision is made)."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.io import registry
from ttt_pipeline.io.tracking import Tracker


@task(name="register-model", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[1, 5])
def register_task(cfg: PipelineConfig, parent_run_id: str, headline: dict | None = None) -> dict:
    """Returns the decision as a dict: version, decision (promoted/kept/skipped), alias, values, reason."""
    tracker = Tracker.from_config(cfg.tracking)
    candidate = (headline or {}).get(cfg.registry.metric)
    result = registry.register_run(tracker.client, parent_run_id, cfg.registry.model_name, cfg.registry.metric,
                                   candidate)
    get_run_logger().info("model registry: %s v%s %s (%s)", result.model_name, result.version or "-",
                          result.decision, result.reason)
    return result.to_dict()
