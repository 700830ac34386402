"""The optional `attribute` task (TRAK, ttt_pipeline.evaluation.attribution) and what it shows: its MLflow child run's
logging and a Prefect table artifact. The flow calls it only when `attribution.enabled`."""

from __future__ import annotations

import logging

from prefect import task

from ttt_pipeline import steps
from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.io import step_logging
from ttt_pipeline.io.remote_store import localise

from .common import COMMON, _out, _store, step_cache
from .progress import Reporter


def _inputs(p: dict) -> dict:
    return steps.attribute_inputs(p["cfg"], _out(p["data"]), _out(p["model"]), _out(p["corrupted"]),
                                  [_out(e) for e in p["evaluations"]])


@task(name="attribute", cache_key_fn=step_cache("attribute", _inputs), **COMMON)
def attribute_task(cfg: PipelineConfig, data: dict, model: dict, corrupted: dict, evaluations: list[dict]) -> dict:
    """Training reviews behind the predictions corruption flipped and defenses fixed or broke."""
    store = _store(cfg)
    data, model, corrupted = (localise(store, d) for d in (data, model, corrupted))  # no-op on a local store
    evaluations = [localise(store, e) for e in evaluations]
    rep = Reporter("attribution-progress")
    try:
        return steps.attribute(cfg, _out(data), _out(model), _out(corrupted), [_out(e) for e in evaluations],
                               store, rep).to_dict()
    finally:
        rep.close()


def log_attribute(tracker, run_id: str, out, cfg: PipelineConfig) -> None:
    """The MLflow child run (step_logging.log_attribute) plus the Prefect table artifact `attribution`."""
    result = steps.load_attribution(out)
    step_logging.log_attribute(tracker, run_id, out, cfg, result)
    _table_artifact(result)


def _table_artifact(result: dict) -> None:
    from prefect.artifacts import create_table_artifact

    from ttt_pipeline.evaluation.attribution import table_rows

    try:
        rows = table_rows(result)
        create_table_artifact(rows or [{"note": "no prediction was flipped, fixed or broken: nothing to explain"}],
                              key="attribution",
                              description=f"TRAK: the top-{result['top_k']} training reviews supporting and opposing "
                                          f"each of {result['n_targets']} explained predictions "
                                          f"({result['n_train']} training reviews attributed)")
    except Exception as exc:  # the UI table is for people; MLflow holds the numbers already
        logging.getLogger(__name__).warning("attribution artifact not created: %s", exc)
