"""The registry task: register the run's model and move the `champion` alias when it wins (see
`ttt_pipeline.io.model_registry` for what is registered and how the decision is made)."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.events import emit_promoted
from ttt_pipeline.io import model_registry as registry
from ttt_pipeline.io.tracking import Tracker


def _transient(task, task_run, state) -> bool:
    """Retry a service hiccup, never a refusal (another task's labels): that fails the same way again."""
    try:
        state.result()
    except registry.LabelMismatch:
        return False
    except Exception:
        return True
    return True


@task(name="register-model", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[1, 5],
      retry_condition_fn=_transient)
def register_task(cfg: PipelineConfig, parent_run_id: str, headline: dict | None = None,
                  labels: list[str] | None = None) -> dict:
    """Registers the model under its task's name (`cfg.model_name(labels)`), judged on `registry.metric`
    (acc_default: the recommended defense's corrupted accuracy). Returns the decision as a dict: model_name,
    metric, version, decision (promoted/kept/skipped), alias, values, reason. A promotion emits the Prefect
    event `ttt.champion.promoted` (ttt_pipeline.events)."""
    tracker = Tracker.from_config(cfg.tracking)
    metric = cfg.registry.metric_key(cfg.evaluation.defense)
    candidate = (headline or {}).get(metric)
    result = registry.register_run(tracker.client, parent_run_id, cfg.model_name(labels), metric, candidate, labels)
    get_run_logger().info("model registry: %s v%s %s on %s (%s)", result.model_name, result.version or "-",
                          result.decision, metric, result.reason)
    decision = result.to_dict()
    emit_promoted(decision)  # ttt.champion.promoted: `ttt-pipeline serve` switches to the new champion
    return decision
