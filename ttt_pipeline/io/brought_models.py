"""Models brought with `evaluate --model`: one registered name per model, however it was brought.

The same weights brought as a folder and as `models:/my-classifier@prod` make the same imported model folder, so the
import step's output digest is theirs. Each registered version of a brought model carries that digest (tag
`weights_digest`) and the spelling it was brought by (tag `brought_as`, the resolved `model.classifier`): a model
whose digest a registered model of the task already holds is registered there again (`registered_name`), and
`reevaluate --model SPELLING` watches the name that spelling was registered under (`watched_name`). An explicit
`registry.model_name` always wins; otherwise the first spelling's name (`ttt-<task>-<labels>-<its name>`) is kept.
"""

from __future__ import annotations

from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.errors import PipelineError

WEIGHTS_TAG = "weights_digest"
SOURCE_TAG = "brought_as"


def _versions(client, tag: str, value: str) -> list:
    if "'" in value:  # MLflow's filter strings have no escape for a quote: such a spelling keeps its own name
        return []
    return list(client.search_model_versions(f"tags.{tag} = '{value}'"))


def name_for(client, default: str, task: str, digest: str | None = None, source: str | None = None) -> str:
    """The registered model of this task (its name starts with `task`) whose oldest version holds these weights
    (`digest`), else one that `source` was brought as; `default` when neither was registered."""
    for tag, value in ((WEIGHTS_TAG, digest), (SOURCE_TAG, source)):
        hits = [v for v in _versions(client, tag, value) if v.name == default or v.name.startswith(f"{task}-")] \
            if value else []
        if hits:
            return min(hits, key=lambda v: (int(v.creation_timestamp or 0), int(v.version))).name
    return default


def _brought(cfg: PipelineConfig) -> bool:
    return bool(cfg.model.classifier) and not cfg.registry.model_name


def registered_name(client, cfg: PipelineConfig, labels: list[str], digest: str) -> PipelineConfig:
    """`cfg` with `registry.model_name` set to the name these weights are registered under (the one holding this
    digest, else the model's own); `cfg` itself for a pipeline-trained model or an explicit registry.model_name."""
    if not _brought(cfg) or not cfg.registry.enabled:
        return cfg
    named = cfg.model_copy(deep=True)
    named.registry.model_name = name_for(client, cfg.model_name(labels), cfg.task_key(labels), digest=digest)
    return named


def tag_version(client, registry: dict | None, digest: str, source: str) -> None:
    """Record the weights' digest and the spelling they were brought by on the version just registered."""
    if not registry or not registry.get("version"):
        return
    client.set_model_version_tag(registry["model_name"], registry["version"], WEIGHTS_TAG, digest)
    client.set_model_version_tag(registry["model_name"], registry["version"], SOURCE_TAG, source)


def watched_name(client, cfg: PipelineConfig, labels: list[str]) -> str:
    """The registered model the nightly judges: for `--model SPELLING`, the name any registration of that spelling
    went to (`brought_as`), else the model's own name; registry.model_name or the task's name otherwise."""
    default = cfg.model_name(labels)
    if not _brought(cfg):
        return default
    return name_for(client, default, cfg.task_key(labels), source=cfg.model.classifier)


def version_at_alias(client, name: str, alias: str):
    """The version a user's own alias of their own registered model points at now (`models:/my-classifier@prod`:
    what `serve` follows); a PipelineError naming the alias when there is none."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException as exc:
        if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
        raise PipelineError(f"registered model {name!r} has no version at alias {alias!r}",
                            f"set it: MlflowClient().set_registered_model_alias({name!r}, {alias!r}, VERSION), or "
                            "check the name, the alias and the tracking URI") from None
