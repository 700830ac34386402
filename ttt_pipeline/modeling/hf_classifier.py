"""A classifier fine-tuned elsewhere: a Hugging Face sequence-classification model behind the pipeline's interface.

`SequenceClassifier` offers what scoring and the defenses use of `ReviewClassifier` (`forward`, `encode`,
`encoder`, `head`, `meta`, and the MLM head's losses when the model has one), so the evaluate step, every
defense, `Classifier`, the logged MLflow Model and serving take either kind. Its logits come in the data's class
order: the model's own `id2label` is matched to the data's labels once, by name (`match_labels`).

Why a wrapper and not transformers' text-classification pipeline: the defenses need the encoder's hidden states,
its LayerNorms and a masked-LM head on the same encoder, which the pipeline object does not hand out.

Masked TTT needs an MLM head on the classifier's encoder: the model folder's own when its weights hold one, else
the head of `ttt.mlm_from` (the checkpoint the classifier was fine-tuned from), whose encoder must have the same
parameter names and shapes (`check_same_encoder`). The head is stored on its own (`mlm/`); on loading it is put
on the classifier's encoder and its decoder tied to the classifier's word embeddings, as in the checkpoint.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ttt_pipeline.errors import ConfigError, DownloadError
from ttt_pipeline.modeling import folder_checks
from ttt_pipeline.modeling.model import MLMHead, MLMScoring, ModelMeta, check_local_source, resolve_model_source
from ttt_pipeline.storage import atomic_dir

KIND = "sequence_classification"
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model")
GENERIC_LABEL = re.compile(r"^LABEL_\d+$")
FIELD = "model.classifier"


@dataclass(frozen=True)
class Source:
    """Where a classifier's weights and its tokenizer are: one folder or hub id for both, except for an MLflow
    `transformers` model, which keeps its tokenizer apart (`components/tokenizer`). `name` is what the user gave."""

    name: str
    model: str
    tokenizer: str

    @property
    def local(self) -> bool:
        return Path(self.model).exists()


def check_folder(src: Source, trust_remote_code: bool) -> dict:
    """The model's config.json, checked before any weights load: a model folder with a classification head, no
    remote code unless allowed, and a tokenizer beside it; each file readable (`folder_checks`)."""
    folder, where = Path(src.model), f"{FIELD} '{src.name}'"
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{FIELD} '{src.name}': {folder} has no config.json, so it is not a Hugging Face model "
                          "folder", "save the model with model.save_pretrained(FOLDER) and its tokenizer with "
                          "tokenizer.save_pretrained(FOLDER), then give that folder")
    config = folder_checks.check_config(folder, where)
    if config.get("auto_map") and not trust_remote_code:
        raise ConfigError(f"{FIELD} '{src.name}': the model needs its own code (auto_map in config.json), and "
                          "model.trust_remote_code is false", "read the code in the folder first; if you trust it, "
                          "add --set model.trust_remote_code=true")
    heads = [a for a in config.get("architectures") or [] if a.endswith("ForSequenceClassification")]
    if config.get("architectures") and not heads:
        raise ConfigError(f"{FIELD} '{src.name}': {', '.join(config['architectures'])} has no sequence-"
                          "classification head", "give a model saved from AutoModelForSequenceClassification "
                          "(fine-tuned on your labels), or train one here with `ttt-pipeline run`")
    tok = Path(src.tokenizer)
    if not any((tok / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"{FIELD} '{src.name}': no tokenizer in {tok} (none of {', '.join(TOKENIZER_FILES)})",
                          "save the tokenizer the model was fine-tuned with beside it: "
                          "tokenizer.save_pretrained(FOLDER)")
    folder_checks.check_weights(folder, config, where)
    folder_checks.check_tokenizer_files(tok, where)
    return config


def load_source(src: Source, trust_remote_code: bool):
    """(sequence-classification model in eval mode, tokenizer); refuses a model whose classification head is
    not in its weights (a plain encoder or a language model would get a random head)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    config = check_folder(src, trust_remote_code) if src.local else None
    if not src.local and src.model.startswith((".", "/", "~")):  # a path that is not there is a typo, not a hub id
        raise ConfigError(f"{FIELD} '{src.name}': folder {src.model} does not exist",
                          "give a model folder, an MLflow model URI (models:/NAME@ALIAS) or a hub id")
    where = f"{FIELD} '{src.name}'"
    try:
        with folder_checks.load_errors(where, Path(src.tokenizer) if src.local else None):
            tokenizer = AutoTokenizer.from_pretrained(src.tokenizer, trust_remote_code=trust_remote_code)
        with folder_checks.load_errors(where, Path(src.model) if src.local else None, config):
            model, info = AutoModelForSequenceClassification.from_pretrained(
                src.model, output_loading_info=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as exc:
        if src.local:
            raise ConfigError(f"{FIELD} '{src.name}' could not be loaded: {str(exc).splitlines()[0]}",
                              "give a folder written by save_pretrained of a sequence-classification model "
                              "(BERT, DistilBERT, RoBERTa families) and its tokenizer") from None
        raise DownloadError(f"{FIELD} '{src.name}' could not be fetched from the Hugging Face hub "
                            f"({type(exc).__name__})", "offline, give a local model folder or an MLflow model "
                            "URI (models:/NAME@ALIAS)") from None
    missing = [k for k in info.get("missing_keys", ()) if not k.startswith(f"{model.base_model_prefix}.")]
    if missing:
        raise ConfigError(f"{FIELD} '{src.name}': {type(model).__name__} has no trained classification head "
                          f"(not in its weights: {', '.join(sorted(missing)[:3])})", "give a model fine-tuned "
                          "for sequence classification, or train one here with `ttt-pipeline run`")
    return model.eval(), tokenizer


def match_labels(model_labels: list[str], data_labels: list[str], label_map: dict[str, str] | None) -> list[int]:
    """`order[j]`: the model's output index of the data's class j. A model label is renamed by `label_map`
    (model label -> data class), then matched to the data's labels by name, ignoring case."""
    renamed = [(label_map or {}).get(name, name) for name in model_labels]
    want = {name.casefold(): j for j, name in enumerate(data_labels)}
    got = {name.casefold(): i for i, name in enumerate(renamed)}
    if len(got) == len(renamed) and got.keys() == want.keys():
        return [got[name.casefold()] for name in data_labels]
    guess = ", ".join(f"{m}: {d}" for m, d in zip(model_labels, data_labels))
    hint = f"map them: --set 'model.label_map={{{guess}}}' (model label: data label; check the pairs)"
    if len(model_labels) != len(data_labels):
        raise ConfigError(f"{FIELD}: the model has {len(model_labels)} labels {model_labels}, the data "
                          f"{len(data_labels)} {data_labels}", "evaluate on data with the model's classes: set "
                          "data.label_names (and data.label_map to merge values) so the two sets match")
    if label_map is None and all(GENERIC_LABEL.match(n) for n in model_labels):
        raise ConfigError(f"{FIELD}: the model's labels are generic ({', '.join(model_labels)}); which one is "
                          f"which of the data's {data_labels} is not written in the model", hint)
    raise ConfigError(f"{FIELD}: the model's labels {renamed} do not match the data's {data_labels}", hint)


def check_same_encoder(classifier: nn.Module, mlm: nn.Module, where: str) -> None:
    """Every encoder tensor of the masked LM exists in the classifier's encoder with the same shape."""
    mine = {k: tuple(v.shape) for k, v in classifier.base_model.state_dict().items()}
    bad = [f"{k} {tuple(v.shape)}" + (f" vs {mine[k]}" if k in mine else " (absent)")
           for k, v in mlm.base_model.state_dict().items() if mine.get(k) != tuple(v.shape)]
    if bad:
        raise ConfigError(f"ttt.mlm_from '{where}': its encoder does not match the classifier's "
                          f"({len(bad)} tensors differ, e.g. {bad[0]})", "give the checkpoint the classifier was "
                          "fine-tuned from (same family and size), or leave ttt.mlm_from null to score without "
                          "masked TTT")


def load_mlm(where: str, trust_remote_code: bool, required: bool):
    """The masked-LM model at `where` if its weights hold a trained MLM head; None otherwise (an error when
    `required`, i.e. the user named it in ttt.mlm_from)."""
    from transformers import AutoModelForMaskedLM

    from ttt_pipeline.modeling.model import _is_mlm_head_key

    source = resolve_model_source(where)
    check_local_source(where, source)
    try:
        mlm, info = AutoModelForMaskedLM.from_pretrained(source, output_loading_info=True,
                                                         trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as exc:
        if not required:
            return None
        raise ConfigError(f"ttt.mlm_from '{where}' could not be loaded as a masked LM: "
                          f"{str(exc).splitlines()[0]}", "give the pretrained checkpoint the classifier was "
                          "fine-tuned from (a folder or hub id with its MLM head)") from None
    if any(_is_mlm_head_key(k) for k in info.get("missing_keys", ())):
        if required:
            raise ConfigError(f"ttt.mlm_from '{where}': its weights hold no trained MLM head",
                              "give a masked-LM checkpoint (e.g. bert-base-uncased, distilroberta-base)")
        return None
    return mlm


def head_state(mlm: nn.Module) -> dict[str, torch.Tensor]:
    """The MLM head's own tensors: not the encoder's, and not a decoder tied to the word embeddings."""
    seen = {mlm.get_input_embeddings().weight.data_ptr()}  # a tensor shared by two names is stored once
    out = {}
    for k, v in mlm.state_dict().items():
        if not k.startswith(f"{mlm.base_model_prefix}.") and v.data_ptr() not in seen:
            seen.add(v.data_ptr())
            out[k] = v.contiguous()
    return out


def attach_mlm(classifier: nn.Module, mlm: nn.Module) -> nn.Module:
    """`mlm` with the classifier's encoder in place of its own (decoder re-tied to the classifier's embeddings)."""
    setattr(mlm, mlm.base_model_prefix, classifier.base_model)
    if getattr(mlm.config, "tie_word_embeddings", True):
        mlm.get_output_embeddings().weight = classifier.get_input_embeddings().weight
    return mlm.eval()


class SequenceClassifier(MLMScoring, nn.Module):
    """A Hugging Face sequence classifier (and an optional MLM head on its encoder) as the pipeline's model."""

    def __init__(self, seq_model: nn.Module, meta: ModelMeta, order: list[int], mlm_model: nn.Module | None = None):
        super().__init__()
        self.seq_model = seq_model
        self.meta = meta
        self.register_buffer("order", torch.tensor(order, dtype=torch.long), persistent=False)
        self.mlm_model = mlm_model
        self.mlm_head = MLMHead(mlm_model) if mlm_model is not None else None

    @property
    def encoder(self) -> nn.Module:
        return self.seq_model.base_model

    @property
    def head(self) -> nn.ModuleList:
        """The modules after the encoder (pre-classifier, classifier, ...): what the defenses never adapt."""
        body = self.seq_model.base_model
        return nn.ModuleList([m for m in self.seq_model.children() if m is not body])

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        logits = self.seq_model(input_ids=input_ids, attention_mask=attention_mask).logits
        return logits.index_select(-1, self.order)


def model_limit(config, tokenizer) -> int:
    """The longest input the model takes: its tokenizer's limit, else its position embeddings (RoBERTa's start
    after the padding index)."""
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < 100_000:
        return limit
    positions = getattr(config, "max_position_embeddings", 512)
    offset = config.pad_token_id + 1 if "roberta" in config.model_type and config.pad_token_id is not None else 0
    return positions - offset


def save_imported(out: Path, seq_model, tokenizer, meta: ModelMeta, order: list[int], mlm=None) -> Path:
    """classifier/ (save_pretrained: safetensors and tokenizer), mlm/ (the head's config and tensors), meta.json,
    labels.json; atomically."""
    with atomic_dir(Path(out)) as tmp:
        seq_model.save_pretrained(tmp / "classifier", safe_serialization=True)
        tokenizer.save_pretrained(tmp / "classifier")
        _drop_load_flags(tmp / "classifier" / "tokenizer_config.json")
        if mlm is not None:
            (tmp / "mlm").mkdir()
            mlm.config.to_json_file(tmp / "mlm" / "config.json")
            save_file(head_state(mlm), str(tmp / "mlm" / "head.safetensors"))
        meta.extra = {**meta.extra, "order": list(order)}
        (tmp / "meta.json").write_text(json.dumps(asdict(meta), indent=2))
        (tmp / "labels.json").write_text(json.dumps(dict(enumerate(meta.label_names)), indent=2))
    return Path(out)


# How a tokenizer was loaded (from the hub cache or a folder), which transformers writes into tokenizer_config.json
# beside the tokenizer's own settings: the same tokenizer loaded two ways would save two files, two digests.
LOAD_FLAGS = ("is_local", "local_files_only")


def _drop_load_flags(path: Path) -> None:
    if path.is_file():
        config = json.loads(path.read_text(encoding="utf-8"))
        if any(k in config for k in LOAD_FLAGS):
            path.write_text(json.dumps({k: v for k, v in config.items() if k not in LOAD_FLAGS}, indent=2,
                                       ensure_ascii=False) + "\n", encoding="utf-8")


def load_imported(folder: Path, meta: ModelMeta, device="cpu"):
    """(SequenceClassifier in eval mode, tokenizer) from a folder written by `save_imported`; no remote code."""
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoTokenizer

    folder = Path(folder)
    seq = AutoModelForSequenceClassification.from_pretrained(folder / "classifier", trust_remote_code=False)
    mlm = None
    if (folder / "mlm" / "head.safetensors").is_file():
        mlm = AutoModelForMaskedLM.from_config(AutoConfig.from_pretrained(folder / "mlm", trust_remote_code=False))
        attach_mlm(seq, mlm)
        mlm.load_state_dict(load_file(str(folder / "mlm" / "head.safetensors")), strict=False)
    tokenizer = AutoTokenizer.from_pretrained(folder / "classifier", trust_remote_code=False)
    model = SequenceClassifier(seq, meta, meta.extra["order"], mlm)
    return model.to(device).eval(), tokenizer


def find_mlm(seq_model: nn.Module, src: Source, mlm_from: str | None, trust_remote_code: bool):
    """(masked LM whose head masked TTT adapts on, or None; where it came from, or why there is none)."""
    if mlm_from:
        mlm = load_mlm(mlm_from, trust_remote_code, required=True)
        check_same_encoder(seq_model, mlm, mlm_from)
        return mlm, f"the MLM head of ttt.mlm_from {mlm_from}"
    mlm = load_mlm(src.model, trust_remote_code, required=False)
    if mlm is not None:
        return mlm, "the model's own MLM head"
    return None, ("masked TTT left out: it adapts on an MLM head, and the model has none (add --set "
                  "ttt.mlm_from=BASE_CHECKPOINT, the masked-LM checkpoint the classifier was fine-tuned from)")


def import_classifier(src: Source, data_labels: list[str], model_cfg, mlm_from: str | None, want_mlm: bool,
                      out: Path) -> dict:
    """The classifier at `src` as a pipeline model folder in `out` (`save_imported`), its labels in the data's
    order; returns what the import found (labels, order, length, MLM head)."""
    seq, tokenizer = load_source(src, model_cfg.trust_remote_code)
    model_labels = [str(seq.config.id2label[i]) for i in range(seq.config.num_labels)]
    order = match_labels(model_labels, data_labels, model_cfg.label_map)
    mlm, mlm_note = find_mlm(seq, src, mlm_from, model_cfg.trust_remote_code) if want_mlm else (
        None, "no method in ttt.methods needs an MLM head")
    limit = model_limit(seq.config, tokenizer)
    # base_model names the architecture, not the spelling it came by (a folder, models:/NAME@ALIAS): the same
    # weights brought two ways make the same model folder, so one digest, one evaluate cache entry, one name
    meta = ModelMeta(base_model=type(seq).__name__, num_labels=len(data_labels), label_names=list(data_labels),
                     head_hidden=[], head_dropout=0.0, max_length=min(model_cfg.max_length, limit),
                     mlm_head_pretrained=mlm is not None, kind=KIND,
                     extra={"model_type": seq.config.model_type, "model_labels": model_labels,
                            "mlm": mlm_note})
    save_imported(out, seq, tokenizer, meta, order, mlm)
    return {"kind": KIND, "source": src.name, "model_type": seq.config.model_type, "architecture": type(seq).__name__,
            "model_labels": model_labels, "order": order, "max_length": meta.max_length, "model_max_length": limit,
            "mlm_head": mlm is not None, "mlm_note": mlm_note,
            "parameters": sum(p.numel() for p in seq.parameters())}


def source_fingerprint(src: Source) -> dict:
    """What the import is keyed by: the files' digests for a local model, the id for a hub model."""
    from ttt_pipeline.storage import tree_digest

    if not src.local:
        return {"hub": src.model, "tokenizer": src.tokenizer}
    return {"model": tree_digest(Path(src.model)),
            "tokenizer": None if src.tokenizer == src.model else tree_digest(Path(src.tokenizer))}
