"""MLflow model registry: every pipeline run registers its model; the best one holds the `champion` alias.

What is registered: the MLflow Model the finetune child run logged as its output (`ttt_pipeline.io.mlflow_model`:
a python_function flavour, so `models:/<name>@champion` loads with `mlflow.pyfunc.load_model`,
`mlflow models serve` and `ttt-pipeline predict`), as `create_model_version(source=<the LoggedModel's artifact
location>, run_id=<finetune child run>, model_id=<its model id>)`: the source lies inside the model's artifact
folder, which is what an MLflow server's source validation asks for, and the version's lineage points at both
the logged model and the run. A run logged before models were MLflow Models (a plain `model` artifact folder:
encoder/, head.safetensors, tokenizer/, meta.json, labels.json) registers `<run artifact URI>/model` instead.

The name: one registered model per task (`PipelineConfig.model_name`: ttt-<task>-<labels>), so models of
different tasks never compete for one alias; the registered model and each version carry their label set (tag
`labels`), and a model with other labels is refused under a name that holds one (`LabelMismatch`).

The decision: the candidate's value of `registry.metric` (default acc_default: the corrupted accuracy under the
recommended defense, `evaluation.default_defense`, logged as acc_corrupted_<defense>; higher is better) is the
pipeline (parent) run's metric. The champion's value is read from the champion version's source run, and from that
run's parent (the pipeline run) when the finetune run does not carry the metric. The candidate becomes
`champion` when there is no champion yet, the champion has no value, or the candidate is strictly higher;
a tie keeps the current champion. Either way the comparison is logged on the pipeline run as tags
(`registry.*`) and metrics (`registry.candidate_value`, `registry.champion_before_value`), and on the new
model version as tags.

Concurrency: the read-compare-set of the alias is not atomic; two pipeline runs finishing at the same
moment could both promote, the later one winning. The values stay logged, so it can be audited.

No Prefect import: `ttt_pipeline/tasks/model_registry.py` wraps `register_run` as a task.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from ttt_pipeline.errors import PipelineError

log = logging.getLogger(__name__)
CHAMPION = "champion"
MODEL_ARTIFACT = "model"
# The child runs that log a pipeline run's model: fine-tune trains it, import-model brings one trained elsewhere.
MODEL_STAGES = ("finetune", "import-model")
LOGGED_MODEL_NAME = "model"  # the MLflow Model a finetune run logs (io.mlflow_model)


class LabelMismatch(PipelineError):
    """The registered model holds models of another label set: its alias must not move to this one."""


@dataclass
class RegistryResult:
    model_name: str
    metric: str
    decision: str  # promoted | kept | skipped
    reason: str
    version: str | None = None
    candidate_value: float | None = None
    champion_before: str | None = None
    champion_before_value: float | None = None
    champion_after: str | None = None
    source: str | None = None
    source_run_id: str | None = None
    model_id: str | None = None
    labels: list[str] | None = None

    @property
    def promoted(self) -> bool:
        return self.decision == "promoted"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "alias": CHAMPION if self.promoted else None}


def decide(candidate: float | None, champion_version: str | None, champion_value: float | None) -> tuple[bool, str]:
    """(promote?, reason). Higher is better; a tie keeps the current champion."""
    if candidate is None:
        return False, "the candidate has no value of the metric"
    if champion_version is None:
        return True, "no champion yet"
    if champion_value is None:
        return True, f"champion v{champion_version} has no value of the metric"
    if candidate > champion_value:
        return True, f"{candidate:.4f} > champion v{champion_version} {champion_value:.4f}"
    return False, f"{candidate:.4f} <= champion v{champion_version} {champion_value:.4f}"


def _is_missing(exc: Exception) -> bool:
    code = getattr(exc, "error_code", "") or ""
    return "RESOURCE_DOES_NOT_EXIST" in code or "NOT_FOUND" in code


def ensure_registered_model(client, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
        return
    except MlflowException as exc:
        if not _is_missing(exc):
            raise
    try:
        client.create_registered_model(
            name, description="Review classifier (encoder + head) fine-tuned by the TTT pipeline; "
            f"alias `{CHAMPION}` = best on the robustness metric.")
    except MlflowException as exc:  # created meanwhile by a concurrent run
        if "RESOURCE_ALREADY_EXISTS" not in (getattr(exc, "error_code", "") or ""):
            raise


def check_labels(client, name: str, labels: list[str] | None, champion=None) -> None:
    """Refuses a model whose labels differ from those the registered model holds (its `labels` tag, else its
    champion's); records them on a registered model that has none yet."""
    if not labels:
        return
    import json

    model = client.get_registered_model(name)
    held = (model.tags or {}).get("labels") or ((champion.tags or {}).get("labels") if champion is not None else None)
    if held and json.loads(held) != list(labels):
        raise LabelMismatch(
            f"registered model {name!r} holds models for the labels {json.loads(held)}; this run's model predicts "
            f"{list(labels)}: the registry does not register it there or move the `{CHAMPION}` alias to it",
            "leave registry.model_name null (each task gets its own name, ttt-<task>-<labels>) or set it to a name "
            "of this task")
    if not (model.tags or {}).get("labels"):
        client.set_registered_model_tag(name, "labels", json.dumps(list(labels)))


def current_champion(client, name: str):
    """The ModelVersion holding the champion alias, or None."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException as exc:
        if _is_missing(exc) or "INVALID_PARAMETER_VALUE" in (getattr(exc, "error_code", "") or ""):
            return None
        raise


def run_metric(client, run_id: str | None, metric: str, follow_parent: bool = True) -> float | None:
    """A run's metric, else its parent's (a finetune child run -> the pipeline run)."""
    if not run_id:
        return None
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        if _is_missing(exc):
            return None
        raise
    if metric in run.data.metrics:
        return float(run.data.metrics[metric])
    parent = run.data.tags.get("mlflow.parentRunId")
    return run_metric(client, parent, metric, False) if follow_parent and parent else None


def champion_value(client, version, metric: str) -> float | None:
    value = run_metric(client, version.run_id, metric)
    if value is None:  # source run deleted: the value recorded on the version at registration
        raw = (version.tags or {}).get(f"metric.{metric}")
        value = float(raw) if raw not in (None, "") else None
    return value


def logged_model_id(client, run_id: str) -> str | None:
    """The newest READY MLflow Model logged as an output of the run, or None."""
    run = client.get_run(run_id)
    outputs = sorted((run.outputs.model_outputs if run.outputs else []) or [], key=lambda o: o.step)
    for out in reversed(outputs):
        lm = client.get_logged_model(out.model_id)
        if str(lm.status) == "READY" and lm.name == LOGGED_MODEL_NAME:
            return lm.model_id
    return None


def find_model_run(client, parent_run_id: str):
    """The newest fine-tune (or import-model) child run of this pipeline run that logged a model (an MLflow Model,
    or a plain `model` artifact folder), or None. MLflow's search takes no IN for tags, so the stages are picked
    from the run's children here."""
    parent = client.get_run(parent_run_id)
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'",
                                  order_by=["attributes.start_time DESC"])
    for run in (r for r in children if r.data.tags.get("stage") in MODEL_STAGES):
        if logged_model_id(client, run.info.run_id) or client.list_artifacts(run.info.run_id, MODEL_ARTIFACT):
            return run
    return None


def model_source(client, model_run) -> tuple[str, str | None]:
    """(source, model id) to register for a finetune run: its MLflow Model, else its plain `model` folder."""
    model_id = logged_model_id(client, model_run.info.run_id)
    if model_id:
        return client.get_logged_model(model_id).artifact_location, model_id
    return f"{model_run.info.artifact_uri.rstrip('/')}/{MODEL_ARTIFACT}", None


def link_version(client, model_id: str, name: str, version: str) -> None:
    """Record the registered version on the logged model (tag mlflow.modelVersions, as mlflow.register_model
    does), so the model's page in the UI lists it."""
    import json

    tag = "mlflow.modelVersions"
    try:
        current = json.loads(client.get_logged_model(model_id).tags.get(tag) or "[]")
        if not any(v.get("name") == name and str(v.get("version")) == str(version) for v in current):
            client.set_logged_model_tags(model_id, {tag: json.dumps(current + [{"name": name,
                                                                                 "version": str(version)}])})
    except Exception as exc:  # the version exists and works; only the UI's back link would be missing
        log.warning("could not link model version %s v%s to logged model %s: %s", name, version, model_id, exc)


def log_decision(client, parent_run_id: str, result: RegistryResult) -> None:
    import time

    from mlflow.entities import Metric, RunTag

    tags = {"registry.model_name": result.model_name, "registry.metric": result.metric,
            "registry.decision": result.decision, "registry.reason": result.reason,
            "registry.version": result.version or "", "registry.champion_before": result.champion_before or "none",
            "registry.champion_after": result.champion_after or "none"}
    now = int(time.time() * 1000)
    metrics = [Metric(f"registry.{k}", float(v), now, 0) for k, v in
               (("candidate_value", result.candidate_value), ("champion_before_value", result.champion_before_value),
                ("promoted", 1.0 if result.promoted else 0.0)) if v is not None]
    client.log_batch(parent_run_id, metrics=metrics, tags=[RunTag(k, str(v)[:5000]) for k, v in tags.items()])


def register_run(client, parent_run_id: str, model_name: str, metric: str,
                 candidate_value: float | None = None, labels: list[str] | None = None) -> RegistryResult:
    """Register this pipeline run's model, promote it to `champion` when it beats the champion, log why.
    `labels`: the model's classes, checked against those the registered model holds (LabelMismatch)."""
    if candidate_value is None:
        candidate_value = run_metric(client, parent_run_id, metric, follow_parent=False)
    model_run = find_model_run(client, parent_run_id)
    if model_run is None:
        result = RegistryResult(model_name, metric, "skipped", "no finetune run with a logged model "
                                "(tracking.log_model=false?)", candidate_value=candidate_value)
        log_decision(client, parent_run_id, result)
        return result

    ensure_registered_model(client, model_name)
    champ = current_champion(client, model_name)
    check_labels(client, model_name, labels, champ)
    champ_version = str(champ.version) if champ is not None else None
    champ_value = champion_value(client, champ, metric) if champ is not None else None

    source, model_id = model_source(client, model_run)
    import json

    tags = {"parent_run_id": parent_run_id, "metric": metric,
            f"metric.{metric}": "" if candidate_value is None else repr(float(candidate_value)),
            **({"labels": json.dumps(list(labels))} if labels else {})}
    existing = client.search_model_versions(f"name = '{model_name}' and run_id = '{model_run.info.run_id}'")
    if existing:  # a retried task: the version exists already, only the decision is left to make
        mv = existing[0]
        if champ_version == str(mv.version):
            champ_version, champ_value = None, None
    else:
        mv = client.create_model_version(model_name, source, run_id=model_run.info.run_id, tags=tags,
                                         description=f"pipeline run {parent_run_id}; {metric}="
                                         f"{'n/a' if candidate_value is None else f'{candidate_value:.4f}'}",
                                         model_id=model_id)
    if model_id:
        link_version(client, model_id, model_name, str(mv.version))
    promote, reason = decide(candidate_value, champ_version, champ_value)
    if promote:
        client.set_registered_model_alias(model_name, CHAMPION, mv.version)
    result = RegistryResult(model_name, metric, "promoted" if promote else "kept", reason, version=str(mv.version),
                            candidate_value=candidate_value, champion_before=champ_version,
                            champion_before_value=champ_value,
                            champion_after=str(mv.version) if promote else champ_version,
                            source=source, source_run_id=model_run.info.run_id, model_id=model_id,
                            labels=list(labels) if labels else None)
    client.set_model_version_tag(model_name, mv.version, "decision", result.decision)
    client.set_model_version_tag(model_name, mv.version, "decision_reason", reason)
    log_decision(client, parent_run_id, result)
    log.info("registry: %s v%s %s (%s)", model_name, mv.version, result.decision, reason)
    return result


def champion_run_id(client, model_name: str) -> str | None:
    """The pipeline (parent) run whose model holds the champion alias, or None."""
    champ = current_champion(client, model_name)
    if champ is None:
        return None
    parent = (champ.tags or {}).get("parent_run_id")
    if parent:
        return parent
    try:
        return client.get_run(champ.run_id).data.tags.get("mlflow.parentRunId") or champ.run_id
    except Exception as exc:
        raise PipelineError(f"champion v{champ.version} of {model_name} points at a missing run {champ.run_id}",
                            "register a new version with `ttt-pipeline run`") from exc


def set_champion(client, model_name: str, version: str) -> RegistryResult:
    """Move the `champion` alias to `version` by hand (a rollback, or a version judged elsewhere); the decision is
    recorded on the version as tags, as `register_run` records its own."""
    from mlflow.exceptions import MlflowException

    try:
        mv = client.get_model_version(model_name, str(version))
    except MlflowException as exc:
        if _is_missing(exc) or "INVALID_PARAMETER_VALUE" in (getattr(exc, "error_code", "") or ""):
            raise PipelineError(f"registered model {model_name!r} has no version {version}",
                                "the MLflow UI's Models page lists the versions; check --tracking-uri") from None
        raise
    before = current_champion(client, model_name)
    metric = (mv.tags or {}).get("metric")
    value = champion_value(client, mv, metric) if metric else None
    client.set_registered_model_alias(model_name, CHAMPION, mv.version)
    reason = f"set by hand (was v{before.version})" if before is not None else "set by hand (no champion before)"
    client.set_model_version_tag(model_name, mv.version, "decision", "promoted")
    client.set_model_version_tag(model_name, mv.version, "decision_reason", reason)
    log.info("registry: %s v%s %s", model_name, mv.version, reason)
    return RegistryResult(model_name, metric or "", "promoted", reason, version=str(mv.version), candidate_value=value,
                          champion_before=str(before.version) if before is not None else None,
                          champion_after=str(mv.version), source=mv.source, source_run_id=mv.run_id)
