"""finetune.augment: seeded corrupted copies of training reviews (robust training), validated and keyed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_config import tiny_config

from ttt_pipeline import steps
from ttt_pipeline.config import AugmentConfig, PipelineConfig, load_config
from ttt_pipeline.corruption import corrupt_texts
from ttt_pipeline.errors import ConfigError
from ttt_pipeline.modeling.augment import augment_dataset, augment_texts
from ttt_pipeline.storage import StepStore

TEXTS = [f"review number {i} says the battery lasted about {i % 7 + 2} days before it died completely"
         for i in range(40)]
LABELS = [i % 4 for i in range(40)]


def test_clean_texts_first_then_copies_with_their_labels():
    aug = augment_texts(TEXTS, LABELS, ["keyboard", "word_swap"], [2, 4], 0.5, seed=1000)
    assert aug.n_clean == 40 and len(aug.texts) == len(aug.labels) == 60 and len(aug.copies) == 20
    assert aug.texts[:40] == TEXTS and aug.labels[:40] == LABELS
    sources = [c["index"] for c in aug.copies]
    assert sources == sorted(set(sources))  # 20 distinct reviews, each copied once, in order
    for c, text, label in zip(aug.copies, aug.texts[40:], aug.labels[40:]):
        assert label == LABELS[c["index"]]
        assert c["family"] in ("keyboard", "word_swap") and c["severity"] in (2, 4)
        # a copy is the suite's corruption of its source, which depends only on (text, family, severity, seed)
        assert text == corrupt_texts([TEXTS[c["index"]]], c["family"], c["severity"], 1000).texts[0]
    # severity 2 of a 14-word review is 0.7 word edits, rounded stochastically: a few copies stay unchanged
    assert sum(t != TEXTS[c["index"]] for c, t in zip(aug.copies, aug.texts[40:])) >= 15
    assert {c["family"] for c in aug.copies} == {"keyboard", "word_swap"}
    assert sum(aug.summary()["copies_by_set"].values()) == 20


def test_deterministic_per_seed_and_share():
    a = augment_texts(TEXTS, LABELS, ["tutorial"], [3], 0.25, seed=7)
    assert a.texts == augment_texts(TEXTS, LABELS, ["tutorial"], [3], 0.25, seed=7).texts and len(a.copies) == 10
    b = augment_texts(TEXTS, LABELS, ["tutorial"], [3], 0.25, seed=8)
    assert a.copies != b.copies and a.texts[40:] != b.texts[40:]
    assert len(augment_texts(TEXTS, LABELS, ["tutorial"], [3], 1.0, seed=7).texts) == 80
    with pytest.raises(ValueError, match="share"):
        augment_texts(TEXTS, LABELS, ["tutorial"], [3], 0.0, seed=7)
    with pytest.raises(ValueError, match="labels"):
        augment_texts(TEXTS, LABELS[:3], ["tutorial"], [3], 0.5, seed=7)


def test_config_validates_and_the_seed_must_differ_from_the_test_corruption():
    cfg = load_config(None, ["finetune.augment.families=[tutorial,keyboard]", "finetune.augment.share=0.3"])
    assert cfg.finetune.augment == AugmentConfig(families=["tutorial", "keyboard"], severities=[3], share=0.3,
                                                 seed=1000)
    assert PipelineConfig().finetune.augment is None
    with pytest.raises(ConfigError, match="finetune.augment.seed"):
        load_config(None, ["finetune.augment.seed=42", "corruption.seed=42"])
    with pytest.raises(ConfigError, match="finetune.augment.families"):
        load_config(None, ["finetune.augment.families=[typo]"])
    with pytest.raises(ConfigError, match="finetune.augment.severities"):
        load_config(None, ["finetune.augment.severities=[6]"])


def test_augment_keys_the_fine_tune_step_only_when_on():
    class Out:
        digest = "d"

    off = steps.finetune_inputs(PipelineConfig(), Out(), Out())
    assert "augment" not in off["finetune"]  # models cached before the field existed keep their keys
    on = steps.finetune_inputs(load_config(None, ["finetune.augment.share=0.5"]), Out(), Out())
    assert on["finetune"]["augment"] == {"families": ["tutorial"], "severities": [3], "share": 0.5, "seed": 1000}


def test_augment_dataset_appends_tokenised_copies(tiny_bert_dir):
    from datasets import Dataset
    from transformers import AutoTokenizer

    from ttt_pipeline.modeling.tokenize import lengths_dataset

    tok = AutoTokenizer.from_pretrained(str(tiny_bert_dir))
    train = lengths_dataset(tok, TEXTS, 32, label=LABELS, text=TEXTS)
    assert isinstance(train, Dataset)
    merged, aug = augment_dataset(train, TEXTS, tok, 32, AugmentConfig(families=["char_drop"], share=0.5, seed=3))
    assert len(merged) == 60 and merged["label"] == aug.labels
    assert merged["input_ids"][:40] == train["input_ids"]
    assert merged["length"] == [len(x) for x in merged["input_ids"]]
    assert merged["input_ids"][40] == tok(aug.texts[40], truncation=True, max_length=32)["input_ids"]


def test_fine_tune_step_trains_on_the_copies(tiny_bert_dir, tmp_path):
    raw = tiny_config(tmp_path, tiny_bert_dir, finetune={"epochs": 1, "mlm_warmup_max_steps": 2},
                      corruption={"families": ["tutorial"], "severities": [3], "seed": 1})
    raw["finetune"]["augment"] = {"families": ["keyboard"], "severities": [3], "share": 0.5, "seed": 5}
    cfg = PipelineConfig.model_validate(raw)
    store = StepStore(tmp_path / "store")
    data = steps.download(cfg, store)
    tokens = steps.tokenise(cfg, data, store)
    out = steps.finetune(cfg, data, tokens, store)
    n_train = tokens.meta["sizes"]["train"]
    assert out.meta["augment"] == {"n_clean": n_train, "n_copies": round(0.5 * n_train),
                                   "copies_by_set": {"keyboard-3": round(0.5 * n_train)}}
    history = json.loads((Path(out.path) / "history.json").read_text())
    assert len(history["epochs"]) == 1
