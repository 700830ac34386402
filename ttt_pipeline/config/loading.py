"""Loading a configuration: presets by name or YAML file, `--set` and form overrides on top, validation with a
message naming the field, and the configuration a flow runs with (`flow_config`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ttt_pipeline.config.overrides import apply_overrides, dotted_overrides, set_path
from ttt_pipeline.config.schema import MOVED_KEYS, PipelineConfig
from ttt_pipeline.config.yaml_format import load_yaml
from ttt_pipeline.errors import ConfigError

# The presets ship inside the package (preset_files), so `--config demo` works from a wheel in any folder; `./`
# paths in a config file are relative to that file (`_file_relative`).
from ttt_pipeline.preset_files import PRESETS_DIR, preset_names

PATH_FIELDS = (("data", "path"), ("data", "test_path"), ("finetune", "unlabeled_path"), ("nightly", "data_path"))


def _format_errors(err: ValidationError, origin: str) -> str:
    lines = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "(root)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden" and field.startswith("ttt.") and field[4:] in MOVED_KEYS:
            msg = f"moved to ttt.{MOVED_KEYS[field[4:]]} (each defense owns its settings)"
        elif e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; `ttt-pipeline config --schema` lists the fields)"
        lines.append(f"config field '{field}': {msg}")
    return f"invalid configuration from {origin}: " + "; ".join(lines)


def resolve_preset(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.is_file():
        return p
    for cand in (PRESETS_DIR / name_or_path, PRESETS_DIR / f"{name_or_path}.yaml"):
        if cand.is_file():
            return cand
    raise ConfigError(
        f"config '{name_or_path}' not found (no such file, and no preset of that name)",
        f"pass a YAML file or one of the presets: {', '.join(preset_names())}",
    )


def load_config(name_or_path: str | None = None, overrides: list[str] | None = None,
                updates: dict[str, Any] | None = None) -> PipelineConfig:
    """A preset (a name or a YAML file; None: the defaults) with `--set KEY=VALUE` overrides (values read as YAML)
    and `updates`, a mapping of typed values (`dotted_overrides`: the Prefect form's overrides), on top."""
    data: dict[str, Any] = {}
    origin = "defaults"
    if name_or_path:
        path = resolve_preset(name_or_path)
        origin = str(path)
        try:
            data = load_yaml(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}", "fix the YAML syntax") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a mapping of sections", "see configs/demo.yaml")
        data = _file_relative(data, path.parent)
    if overrides:
        data = apply_overrides(data, overrides)
        origin += " + --set"
    return _validated(data, updates, origin)


def _validated(data: dict[str, Any], updates: dict[str, Any] | None, origin: str) -> PipelineConfig:
    for key, value in dotted_overrides(updates or {}).items():
        set_path(data, key, value, f"overrides {key}")
    origin += " + overrides" if updates else ""
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, origin), "fix the field named above") from None


def _file_relative(data: dict, folder: Path) -> dict:
    """A config file's `./` paths start at its own folder (a preset's bundled reviews, a project's config beside
    its data); every other relative path starts at the current folder, as on the command line."""
    def fix(value):
        return str((folder / value).resolve()) if isinstance(value, str) and value.startswith("./") else value

    for section, key in PATH_FIELDS:
        node = data.get(section)
        if isinstance(node, dict) and key in node:
            node[key] = fix(node[key])
    shift = data.get("data", {}).get("shift") if isinstance(data.get("data"), dict) else None
    if isinstance(shift, dict):
        data["data"]["shift"] = {k: fix(v) for k, v in shift.items()}
    return data


def absolute_paths(cfg: PipelineConfig) -> PipelineConfig:
    """A copy whose local paths (data, shift sets, store, artifact root, sqlite database, a local model folder) are
    absolute, taken from the current folder once: the command line, a deployment's worker in another folder and the
    UI then read the same files. URLs (`gdown://`, `hf://`, `s3://`, `pypi:` models) are left as they are."""
    def local(value: str) -> str:
        return value if "://" in value else str(Path(value).expanduser().resolve())

    cfg = cfg.model_copy(deep=True)
    cfg.store, cfg.tracking.artifact_root = local(cfg.store), local(cfg.tracking.artifact_root)
    uri = cfg.tracking.tracking_uri
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        cfg.tracking.tracking_uri = "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    d = cfg.data
    d.path = local(d.path)
    d.test_path = local(d.test_path) if d.test_path else d.test_path
    d.shift = {k: local(v) for k, v in d.shift.items()}
    cfg.model.name = _local_model(cfg.model.name)
    cfg.model.classifier = cfg.model.classifier and _local_model(cfg.model.classifier)
    cfg.ttt.mlm_from = cfg.ttt.mlm_from and _local_model(cfg.ttt.mlm_from)
    return cfg


def _local_model(name: str) -> str:
    """A model folder's absolute path; a hub id, an MLflow URI or a `pypi:` model as it is."""
    if "://" in name or ":/" in name or name.startswith("pypi:"):
        return name
    if name.startswith((".", "~")) or Path(name).expanduser().exists():
        return str(Path(name).expanduser().resolve())
    return name


def preset_summary(name: str) -> dict[str, Any]:
    """What a preset scores a model on, read through `load_config` (its `./` paths resolved): the task (the
    registered model's name stem, ttt-<task>-<labels>; None when the labels come from the data), the labels, the
    data source and whether it ships in the package, where the test reviews come from, the shift sets."""
    cfg = load_config(name)
    d = cfg.data
    labels = [str(n) for n in d.label_names] if d.label_names else None
    task = cfg.task_key() if labels else None
    packaged = "://" not in d.path and Path(d.path).resolve().is_relative_to(PRESETS_DIR.resolve())
    shown = str(Path(d.path).resolve().relative_to(PRESETS_DIR.resolve().parents[1])) if packaged else d.path
    return {"name": name, "task": task, "labels": labels, "data": shown, "packaged": packaged,
            "scheme": d.path.split("://")[0] if "://" in d.path else None,
            "test_path": d.test_path, "test_fraction": d.test_fraction, "split_seed": d.split_seed,
            "group_column": d.group_column, "shift": sorted(d.shift)}


DEFAULT_PRESET = "demo"


def default_config() -> PipelineConfig:
    """The flows' default `config` (the Prefect UI's form, the deployments): the demo preset, a measured recipe
    that runs offline on the shipped reviews from the project folder."""
    return load_config(DEFAULT_PRESET)


def flow_config(config: PipelineConfig | None = None, preset: str | None = None,
                overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """The configuration a flow runs with, from its parameters: `config`, a whole PipelineConfig (what the command
    line passes), else `preset` by name (a deployment's form; None: the demo preset), each with `overrides` on top,
    a mapping of dotted keys or sections (`{"model.classifier": "models:/my-classifier@prod"}`).

    `config` takes the place of `preset` rather than clashing with it: Prefect merges a run's parameters into the
    deployment's defaults, so `--params '{"config": ...}'` arrives beside the deployment's `preset: demo`. The
    preset is read when the flow runs, on the worker, so its bundled files resolve in the package installed there.
    """
    if config is None:
        return load_config(preset or DEFAULT_PRESET, updates=overrides)
    if not overrides:
        return config
    return _validated(config.model_dump(mode="python"), overrides, "config")
