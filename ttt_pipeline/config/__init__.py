"""The one typed configuration: the flow parameter, the CLI's --set target and the YAML presets' schema.

schema.py holds the typed sections and `PipelineConfig`; loading.py the presets, YAML files and validation
(`load_config`, `flow_config`); overrides.py the `--set` parsing; yaml_format.py the YAML dialect both read.
Every public name is re-exported here, so callers import from `ttt_pipeline.config`.
"""

from ttt_pipeline.config.loading import (
    DEFAULT_PRESET,
    PATH_FIELDS,
    PRESETS_DIR,
    absolute_paths,
    default_config,
    flow_config,
    load_config,
    preset_names,
    resolve_preset,
)
from ttt_pipeline.config.overrides import apply_overrides, dotted_overrides, parse_value
from ttt_pipeline.config.schema import (
    MOVED_KEYS,
    AttributionConfig,
    AugmentConfig,
    CorruptionConfig,
    DataConfig,
    EvaluationConfig,
    ExecutionConfig,
    FinetuneConfig,
    ModelConfig,
    NightlyConfig,
    PipelineConfig,
    RegistryConfig,
    Section,
    TrackingConfig,
    TTTConfig,
    classifier_name,
    flatten,
    moved_keys,
    nest,
    task_of,
)
from ttt_pipeline.config.yaml_format import FLOAT_1_2, YAMLDumper, YAMLLoader, dump_yaml, load_yaml

__all__ = [
    "DEFAULT_PRESET", "FLOAT_1_2", "MOVED_KEYS", "PATH_FIELDS", "PRESETS_DIR", "AttributionConfig", "AugmentConfig",
    "CorruptionConfig", "DataConfig", "EvaluationConfig", "ExecutionConfig", "FinetuneConfig", "ModelConfig",
    "NightlyConfig", "PipelineConfig", "RegistryConfig", "Section", "TTTConfig", "TrackingConfig", "YAMLDumper",
    "YAMLLoader", "absolute_paths", "apply_overrides", "classifier_name", "default_config", "dotted_overrides",
    "dump_yaml", "flatten", "flow_config", "load_config", "load_yaml", "moved_keys", "nest", "parse_value",
    "preset_names", "resolve_preset", "task_of",
]
