"""`--set KEY=VALUE` parsing, and the Prefect form's overrides: dotted keys onto a configuration's mapping."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel

from ttt_pipeline.config.schema import PipelineConfig
from ttt_pipeline.config.yaml_format import load_yaml
from ttt_pipeline.errors import ConfigError


def parse_value(raw: str) -> Any:
    """`--set k=v` values are YAML scalars/lists, so `3`, `1e-4`, `[a, b]` and `null` get their types."""
    try:
        return load_yaml(raw)
    except yaml.YAMLError:
        return raw


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set '{item}' is not KEY=VALUE", "write e.g. --set finetune.epochs=2")
        key, raw = item.split("=", 1)
        set_path(data, key, parse_value(raw), f"--set {key}")
    return data


def set_path(data: dict[str, Any], key: str, value: Any, origin: str) -> None:
    """`data["finetune"]["epochs"] = value` for the key `finetune.epochs`: the value replaces what is there."""
    parts = key.strip().split(".")
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{origin}: '{p}' is not a section", "use section.field, e.g. data.path")
    node[parts[-1]] = value


def _section_type(model: type[BaseModel] | None, name: str) -> type[BaseModel] | None:
    field = model.model_fields.get(name) if model is not None else None
    ann = field.annotation if field is not None else None
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def dotted_overrides(overrides: dict[str, Any], model: type[BaseModel] | None = None,
                     prefix: str = "") -> dict[str, Any]:
    """A mapping of overrides as dotted keys: `{"finetune": {"epochs": 2}}` and `{"finetune.epochs": 2}` both give
    `{"finetune.epochs": 2}`. Mappings are opened only where the key names a section, so a dict-valued field
    (`data.shift`, `data.label_map`) is replaced whole, as `--set data.shift={}` replaces it."""
    model = PipelineConfig if model is None else model
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        *parents, last = str(key).split(".")
        node: type[BaseModel] | None = model
        for p in parents:
            node = _section_type(node, p)
        section = _section_type(node, last)
        if section is not None and isinstance(value, dict):
            out.update(dotted_overrides(value, section, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out

