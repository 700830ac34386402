"""Models brought with `evaluate --model`: one registered name per model, however it was brought.

The same weights brought as a folder and as `models:/my-classifier@prod` make the same imported model folder, so the
import step's output digest is theirs. Each registered version of a brought model carries that digest (tag
`weights_digest`) and the spelling it was brought by (tag `brought_as`, the resolved `model.classifier`): a model
whose digest a registered model of the task already holds is registered there again (`registered_name`), and
`reevaluate --model SPELLING` watches the name that spelling was registered under (`watched_name`). An explicit
`registry.model_name` always wins; otherwise the first spelling's name (`ttt-<task>-<labels>-<its name>`) is kept.

A spelling can name other files tomorrow: a user's alias (`models:/my-classifier@prod`) moves to a new version, a
folder is saved over. Each registered version also carries the key of the files its spelling named when they were
imported (tag `brought_files`: the import step's own `source` input), so the nightly judges the version registered
from the files the spelling names tonight (`version_of_files`), whichever of the name's versions holds `champion`.
"""

from __future__ import annotations

import json
from pathlib import Path

from ttt_pipeline.config import PipelineConfig
from ttt_pipeline.errors import NoChampion, PipelineError
from ttt_pipeline.io.model_registry import CHAMPION
from ttt_pipeline.storage import MANIFEST, stable_hash

WEIGHTS_TAG = "weights_digest"
SOURCE_TAG = "brought_as"
FILES_TAG = "brought_files"


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


def is_brought(cfg: PipelineConfig) -> bool:
    """A model brought with `evaluate --model` and no explicit registry.model_name."""
    return bool(cfg.model.classifier) and not cfg.registry.model_name


def registered_name(client, cfg: PipelineConfig, labels: list[str], digest: str) -> PipelineConfig:
    """`cfg` with `registry.model_name` set to the name these weights are registered under (the one holding this
    digest, else the model's own); `cfg` itself for a pipeline-trained model or an explicit registry.model_name."""
    if not is_brought(cfg) or not cfg.registry.enabled:
        return cfg
    named = cfg.model_copy(deep=True)
    named.registry.model_name = name_for(client, cfg.model_name(labels), cfg.task_key(labels), digest=digest)
    return named


def tag_version(client, registry: dict | None, digest: str, source: str, files: str | None = None) -> None:
    """Record the weights' digest, the spelling they were brought by and the key of the files it named
    (`imported_files`) on the version just registered."""
    if not registry or not registry.get("version"):
        return
    tags = {WEIGHTS_TAG: digest, SOURCE_TAG: source, **({FILES_TAG: files} if files else {})}
    for key, value in tags.items():
        client.set_model_version_tag(registry["model_name"], registry["version"], key, value)


def files_key(fingerprint: dict) -> str:
    """The short key of the files a spelling named (hf_classifier.source_fingerprint: their digests, or a hub id)."""
    return stable_hash(fingerprint)[:24]


def imported_files(model: dict) -> str | None:
    """The files key of an import step's output, from the `source` input its manifest records."""
    try:
        return files_key(json.loads((Path(model["path"]) / MANIFEST).read_text())["inputs"]["source"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def current_files(spelling: str, tracking_uri: str) -> str:
    """The files key of what `spelling` names now (an MLflow model is downloaded to a temporary folder)."""
    from ttt_pipeline.io.model_source import fetched
    from ttt_pipeline.modeling.hf_classifier import source_fingerprint

    with fetched(spelling, tracking_uri) as source:
        return files_key(source_fingerprint(source))


def version_of_files(client, name: str, files: str, spelling: str):
    """The version of `name` registered from these files, or from the same weights by another spelling: the
    champion if it is one of them, else the newest. None when no version of `name` carries a files key (registered
    before they were kept: the champion is judged); NoChampion when no version came from these files."""
    if "'" in name:
        return None
    versions = sorted(client.search_model_versions(f"name = '{name}'"), key=lambda v: int(v.version))
    tags = {v.version: v.tags or {} for v in versions}
    tagged = [v for v in versions if FILES_TAG in tags[v.version]]
    if not tagged:
        return None
    weights = {tags[v.version].get(WEIGHTS_TAG) for v in tagged if tags[v.version][FILES_TAG] == files} - {None}
    same = [v for v in versions if tags[v.version].get(FILES_TAG) == files or tags[v.version].get(WEIGHTS_TAG) in weights]
    if not same:
        held = ", ".join(f"v{v.version}" for v in tagged)
        raise NoChampion(f"{spelling} names other files than any version of registered model {name!r} was "
                         f"evaluated on ({held}): nothing judged to re-evaluate",
                         "evaluate them once with the same model, preset and settings (they register as a new "
                         f"version of {name}); the nightly judges that version from then on")
    champion = _champion_version(client, name)
    pick = next((v for v in same if str(v.version) == champion), same[-1])
    return client.get_model_version(name, str(pick.version))


def _champion_version(client, name: str) -> str | None:
    try:
        return str(version_at_alias(client, name, CHAMPION).version)
    except PipelineError:  # no champion yet: the newest matching version is judged
        return None


def watched_name(client, cfg: PipelineConfig, labels: list[str]) -> str:
    """The registered model the nightly judges: for `--model SPELLING`, the name any registration of that spelling
    went to (`brought_as`), else the model's own name; registry.model_name or the task's name otherwise."""
    default = cfg.model_name(labels)
    if not is_brought(cfg):
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
