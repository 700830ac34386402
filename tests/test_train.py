"""Fine-tuning: weighted length-grouped batches keep class balance and cut padding; training learns."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from ttt_pipeline.config import FinetuneConfig, ModelConfig
from ttt_pipeline.errors import ConfigError
from ttt_pipeline.modeling.train import WeightedLengthGroupedBatches, class_weights, mlm_mask


def test_class_weights_are_inverse_frequency():
    w = class_weights([0] * 30 + [1] * 10, 2)
    assert w.tolist() == pytest.approx([40 / 60, 40 / 20])


def test_weighted_batches_balance_classes_and_group_lengths():
    rng = np.random.default_rng(0)
    labels = np.array([0] * 900 + [1] * 100)
    lengths = rng.integers(10, 128, size=1000).tolist()
    w = class_weights(labels.tolist(), 2)[torch.tensor(labels)]
    grouped = WeightedLengthGroupedBatches(w, lengths, 32, seed=1, grouped=True, group=10)
    plain = WeightedLengthGroupedBatches(w, lengths, 32, seed=1, grouped=False)
    idx = [i for b in grouped for i in b]
    assert len(idx) == 1000
    assert 0.4 < labels[idx].mean() < 0.6  # the minority class is drawn as often as the majority
    lens = np.asarray(lengths)

    def padded(batches):
        return sum(len(b) * lens[b].max() for b in batches)

    assert padded(list(grouped)) < 0.75 * padded(list(plain))  # far less padding
    grouped.set_epoch(3)
    again = WeightedLengthGroupedBatches(w, lengths, 32, seed=1, grouped=True, group=10)
    again.set_epoch(3)
    assert list(grouped) == list(again)  # a resumed run draws the same batches


def test_smaller_length_groups_sort_only_within_their_mega_batch():
    lengths = list(range(256, 0, -1))  # row i has length 256 - i
    sampler = WeightedLengthGroupedBatches(None, lengths, 8, seed=0, grouped=True, group=2)
    g = torch.Generator().manual_seed(0)
    drawn = torch.randperm(256, generator=g).numpy()  # the draw the sampler makes before grouping
    spans = [set(drawn[i:i + 16].tolist()) for i in range(0, 256, 16)]
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(256))
    for b in batches:  # each batch comes from one 16-row mega-batch, not from the whole epoch's sort
        assert any(set(b) <= span for span in spans)
    # batches stay mixed: the whole-epoch sort (group=50 here) would give each batch a length spread of 7
    assert np.mean([np.ptp(np.asarray(lengths)[b]) for b in batches]) > 30


def test_mlm_mask_skips_special_and_padding_and_masks_every_row():
    ids = torch.tensor([[101, 5, 6, 7, 102, 0, 0], [101, 8, 102, 0, 0, 0, 0]])
    am = (ids != 0).long()
    gen = torch.Generator().manual_seed(0)
    m = mlm_mask(ids, am, [0, 101, 102], 0.01, gen)
    assert m.any(1).all()
    assert not m[ids == 0].any() and not m[ids == 101].any() and not m[ids == 102].any()


@pytest.mark.parametrize("alignment,passes,precision", [("joint", 2, "auto"), ("joint", 1, "auto"),
                                                        ("frozen", 2, "auto"), ("dapt", 2, "auto"),
                                                        ("joint", 1, "bf16")])
def test_training_learns_a_separable_task(alignment, passes, precision, tiny_bert_dir, tmp_path):
    from datasets import Dataset

    from ttt_pipeline.modeling.model import build_classifier
    from ttt_pipeline.modeling.train import evaluate_split, finetune

    torch.manual_seed(0)
    model, tok = build_classifier(ModelConfig(name=str(tiny_bert_dir), head_hidden=[16]), ["neg", "pos"])
    pos = ["great excellent love it", "excellent great quality", "love it great value", "wonderful great buy"]
    neg = ["terrible broken awful", "awful refund broken", "broken terrible waste", "awful waste of money"]
    texts = (pos + neg) * 6
    labels = ([1] * 4 + [0] * 4) * 6
    enc = tok(texts, truncation=True, max_length=16)
    ds = Dataset.from_dict({"input_ids": enc["input_ids"], "label": labels,
                            "length": [len(x) for x in enc["input_ids"]]})
    cfg = FinetuneConfig(epochs=10, batch_size=8, lr=2e-3, alignment=alignment, joint_passes=passes,
                         dapt_epochs=1, early_stopping_patience=0, seed=0, precision=precision)
    result = finetune(model, tok, ds, ds, cfg, tmp_path / "work")
    assert len(result.history) == 10
    assert result.history[-1]["val_acc"] == 1.0
    assert evaluate_split(model, tok, ds, 16, "cpu")["acc"] == 1.0
    if alignment != "frozen":
        assert result.history[-1]["train_mlm_loss"] < np.log(tok.vocab_size)
    if alignment == "dapt":
        assert len(result.dapt_curve) > 0


def test_autocast_precision_per_device():
    from ttt_pipeline.modeling.precision import resolve_precision

    def autocast_dtype(device, precision):
        return resolve_precision(device, precision, "finetune.precision").dtype

    cpu = torch.device("cpu")
    assert autocast_dtype(cpu, "auto") is None and autocast_dtype(cpu, "fp32") is None  # no native bf16 (conftest)
    assert autocast_dtype(cpu, "bf16") is torch.bfloat16  # forced: honoured, with a warning
    with pytest.raises(ConfigError, match="finetune.precision=fp16 needs a CUDA device"):
        autocast_dtype(cpu, "fp16")  # device auto on a CPU-only machine: refused before any training
    with pytest.raises(ValidationError, match="precision fp16 needs device cuda"):
        FinetuneConfig(device="cpu", precision="fp16")  # explicit: refused at the edge


def test_single_pass_joint_pools_over_unmasked_tokens_only(tiny_bert_dir, tmp_path, monkeypatch):
    """One pass classifies the masked copy: the [MASK] states (absent from clean test inputs) stay out of the
    pooled vector, and every real token that was not masked stays in."""
    from datasets import Dataset

    from ttt_pipeline.modeling.model import ReviewClassifier, build_classifier
    from ttt_pipeline.modeling.train import finetune

    torch.manual_seed(0)
    model, tok = build_classifier(ModelConfig(name=str(tiny_bert_dir), head_hidden=[8], pooling="mean"),
                                  ["neg", "pos"])
    texts = ["great excellent love it a lot", "awful broken terrible waste of money"] * 4
    enc = tok(texts, truncation=True, max_length=16)
    ds = Dataset.from_dict({"input_ids": enc["input_ids"], "label": [1, 0] * 4,
                            "length": [len(x) for x in enc["input_ids"]]})
    seen = []
    real_encode, real_classify = ReviewClassifier.encode, ReviewClassifier.classify_hidden

    def encode(self, ids, am):
        seen.append({"ids": ids.clone(), "am": am.clone()})
        return real_encode(self, ids, am)

    def classify(self, hidden, am):
        seen[-1]["pool_mask"] = am.clone()
        return real_classify(self, hidden, am)

    monkeypatch.setattr(ReviewClassifier, "encode", encode)
    monkeypatch.setattr(ReviewClassifier, "classify_hidden", classify)
    cfg = FinetuneConfig(epochs=1, batch_size=4, lr=1e-3, alignment="joint", joint_passes=1, mlm_prob=0.3,
                         early_stopping_patience=0, seed=0, mlm_warmup_max_steps=0)
    finetune(model, tok, ds, None, cfg, tmp_path / "work")
    steps = [s for s in seen if "pool_mask" in s]
    assert steps and all(s["ids"].shape == s["pool_mask"].shape for s in steps)
    masked = torch.cat([(s["ids"] == tok.mask_token_id).flatten() for s in steps])
    pooled = torch.cat([s["pool_mask"].bool().flatten() for s in steps])
    real = torch.cat([s["am"].bool().flatten() for s in steps])
    assert masked.sum() > 0
    assert not (pooled & masked).any()  # no [MASK] state in the pooled mean
    assert torch.equal(pooled, real & ~masked)  # every unmasked real token is in it


def _tiny_ds(tok, repeats: int):
    """Four separable reviews (positive, negative, ...), `repeats` times, tokenised as the training step reads them."""
    from datasets import Dataset

    texts = ["great excellent love it", "terrible broken awful", "love it great value", "awful waste of money"]
    enc = tok(texts * repeats, truncation=True, max_length=16)
    return Dataset.from_dict({"input_ids": enc["input_ids"], "label": [1, 0, 1, 0] * repeats,
                              "length": [len(x) for x in enc["input_ids"]]})


def test_frozen_encoder_mode_fits_the_heads_on_an_unchanged_body(tiny_bert_dir, tmp_path):
    """Issue 35, the TTT-MAE protocol: the encoder (embeddings included, though BERT ties them to its MLM
    decoder) leaves fine-tuning bit for bit as it came out of the MLM-head warm-up; the classifier and the MLM
    head's own parameters learn; every parameter takes gradients again afterwards (TTT adapts the body)."""
    from ttt_pipeline.modeling.model import build_classifier
    from ttt_pipeline.modeling.train import finetune, trainable_parameters

    torch.manual_seed(0)
    model, tok = build_classifier(ModelConfig(name=str(tiny_bert_dir), head_hidden=[16], pooling="mean"),
                                  ["neg", "pos"])
    ds = _tiny_ds(tok, 6)
    cfg = FinetuneConfig(epochs=12, batch_size=8, lr=1e-2, mode="frozen_encoder", alignment="joint",
                         early_stopping_patience=0, seed=0, precision="fp32", mlm_warmup_max_steps=0)
    body = {n: p.detach().clone() for n, p in model.encoder.named_parameters()}
    head = [p.detach().clone() for p in model.head.parameters()]
    result = finetune(model, tok, ds, ds, cfg, tmp_path / "work")
    assert all(torch.equal(p, body[n]) for n, p in model.encoder.named_parameters())
    assert not all(torch.equal(a, b) for a, b in zip(head, model.head.parameters()))
    assert result.history[-1]["val_acc"] >= 0.75  # a separable task, from frozen random features
    assert all(p.requires_grad for p in model.parameters())
    trainable = trainable_parameters(model, "frozen_encoder")
    assert {id(p) for p in model.head.parameters()} <= {id(p) for p in trainable}
    assert not {id(p) for p in model.encoder.parameters()} & {id(p) for p in trainable}
    assert len(trainable_parameters(model, "full")) == len(list(model.parameters()))


def test_attention_dropout_is_set_while_training_only_and_changes_the_training(make_tiny_clf, tmp_path, monkeypatch):
    """finetune.attention_dropout: every self-attention dropout takes the value during the epochs (the fused
    attention reads it there), the checkpoint's own afterwards; null trains exactly as before the field existed."""
    import ttt_pipeline.modeling.train as train

    seen = []
    epoch = train._train_epoch

    def recording_epoch(loop, *args):
        seen.append([d.p for d in train.attention_dropouts(loop.model)])
        return epoch(loop, *args)

    monkeypatch.setattr(train, "_train_epoch", recording_epoch)
    weights = {}
    for p in (None, 0.0):
        model, tok = make_tiny_clf(("neg", "pos"))
        own = [d.p for d in train.attention_dropouts(model)]
        assert len(own) == 2 and set(own) == {0.1}  # the tiny BERT's two layers, its config's value
        cfg = FinetuneConfig(epochs=2, batch_size=8, lr=1e-3, early_stopping_patience=0, seed=0, precision="fp32",
                             mlm_warmup_max_steps=0, attention_dropout=p)
        train.finetune(model, tok, _tiny_ds(tok, 4), _tiny_ds(tok, 4), cfg, tmp_path / str(p))
        assert [d.p for d in train.attention_dropouts(model)] == own
        weights[p] = torch.cat([q.detach().flatten() for q in model.encoder.parameters()])
    assert seen == [[0.1, 0.1]] * 2 + [[0.0, 0.0]] * 2
    assert not torch.equal(weights[None], weights[0.0])


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_activation_checkpointing_trains_the_same_weights_and_is_on_while_training_only(
        make_tiny_clf, tmp_path, monkeypatch, attention):
    """finetune.activation_checkpointing recomputes each layer in the backward pass with the dropout draws of the
    forward (transformers' non-reentrant checkpointing keeps the RNG state): bit for bit the weights of a run
    without it, which is why it is left out of the fine-tune's cache key."""
    import ttt_pipeline.modeling.train as train
    from ttt_pipeline import steps
    from ttt_pipeline.config import load_config

    seen = []
    epoch = train._train_epoch

    def checkpointing(model):
        enc = model.mlm_model
        return enc.is_activation_checkpointing if hasattr(enc, "is_activation_checkpointing") else \
            enc.is_gradient_checkpointing

    def recording_epoch(loop, *args):
        seen.append(checkpointing(loop.model))
        return epoch(loop, *args)

    monkeypatch.setattr(train, "_train_epoch", recording_epoch)
    weights = {}
    for on in (False, True):
        model, tok = make_tiny_clf(("neg", "pos"))
        cfg = FinetuneConfig(epochs=2, batch_size=8, lr=1e-3, early_stopping_patience=0, seed=0, precision="fp32",
                             mlm_warmup_max_steps=0, attention=attention, activation_checkpointing=on)
        train.finetune(model, tok, _tiny_ds(tok, 4), _tiny_ds(tok, 4), cfg, tmp_path / f"{attention}-{on}")
        assert not checkpointing(model)
        assert not getattr(model.mlm_model, "_require_grads_hooks", None)  # transformers' embedding hook removed too
        assert not getattr(model.mlm_model, "_require_grads_hook", None)
        weights[on] = [q.detach().clone() for q in model.parameters()]
    assert seen == [False, False, True, True]
    assert all(torch.equal(a, b) for a, b in zip(weights[False], weights[True]))

    class Out:
        digest = "d"

    on = load_config(None, ["finetune.activation_checkpointing=true"])
    assert steps.finetune_inputs(on, Out(), Out()) == steps.finetune_inputs(load_config(None, []), Out(), Out())
    assert "activation_checkpointing=true" in steps.memory_hint(load_config(None, []), "finetune")
    assert "activation_checkpointing" not in steps.memory_hint(on, "finetune")
    frozen = load_config(None, ["finetune.activation_checkpointing=true", "finetune.mode=frozen_encoder"])
    assert train._checkpointing(frozen.finetune) is False and train._checkpointing(on.finetune) is True

    class NoCheckpointing(torch.nn.Module):
        mlm_model = torch.nn.Linear(2, 2)

    with pytest.raises(ConfigError, match="finetune.activation_checkpointing") as err:
        with train.training_checkpointing(NoCheckpointing(), True):
            pass
    assert "false" in err.value.hint


def test_attention_dropout_is_validated_and_keys_the_fine_tune_only_when_set(monkeypatch):
    from ttt_pipeline import steps
    from ttt_pipeline.config import PipelineConfig, load_config
    from ttt_pipeline.modeling.train import training_attention_dropout

    class Out:
        digest = "d"

    assert "attention_dropout" not in steps.finetune_inputs(PipelineConfig(), Out(), Out())["finetune"]
    on = load_config(None, ["finetune.attention_dropout=0"])
    assert steps.finetune_inputs(on, Out(), Out())["finetune"]["attention_dropout"] == 0.0
    with pytest.raises(ConfigError, match="finetune.attention_dropout"):
        load_config(None, ["finetune.attention_dropout=1.5"])
    monkeypatch.setenv("TTT_CPU_NATIVE_BF16", "0")  # fp32: auto keeps the fused attention
    assert "attention_dropout=0" in steps.memory_hint(PipelineConfig(), "finetune")
    assert "attention_dropout" not in steps.memory_hint(on, "finetune")
    monkeypatch.setenv("TTT_CPU_NATIVE_BF16", "1")  # bf16: auto trains with eager attention, which keeps the scores
    assert "finetune.attention=sdpa" in steps.memory_hint(on.model_copy(update={"finetune": on.finetune.model_copy(
        update={"device": "cpu"})}), "finetune")

    class NoAttention(torch.nn.Module):
        encoder = torch.nn.Linear(2, 2)

    with pytest.raises(ConfigError, match="finetune.attention_dropout") as err:
        with training_attention_dropout(NoAttention(), 0.0):
            pass
    assert "null" in err.value.hint


def test_attention_implementation_is_set_while_training_only(make_tiny_clf, tmp_path, monkeypatch):
    """finetune.attention: the encoder runs the resolved implementation during the epochs and its own afterwards
    (a saved model serves as it always did); auto under fp32 changes nothing."""
    import ttt_pipeline.modeling.train as train

    seen = []
    epoch = train._train_epoch

    def recording_epoch(loop, *args):
        seen.append(loop.model.mlm_model.config._attn_implementation)
        return epoch(loop, *args)

    monkeypatch.setattr(train, "_train_epoch", recording_epoch)
    for attention in ("auto", "eager"):
        model, tok = make_tiny_clf(("neg", "pos"))
        own = model.mlm_model.config._attn_implementation
        cfg = FinetuneConfig(epochs=1, batch_size=8, lr=1e-3, early_stopping_patience=0, seed=0, precision="fp32",
                             mlm_warmup_max_steps=0, attention=attention, device="cpu")
        train.finetune(model, tok, _tiny_ds(tok, 4), _tiny_ds(tok, 4), cfg, tmp_path / attention)
        assert model.mlm_model.config._attn_implementation == own == "sdpa"
    assert seen == ["sdpa", "eager"]


def test_an_encoder_that_cannot_switch_its_attention_fails_when_asked_and_keeps_its_own_under_auto(caplog):
    from ttt_pipeline.modeling.precision import resolve_attention
    from ttt_pipeline.modeling.train import training_attention

    class Fixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mlm_model = torch.nn.Linear(2, 2)
            self.mlm_model.config = type("Config", (), {"_attn_implementation": "sdpa"})()

    with pytest.raises(ConfigError, match="cannot switch its attention to eager") as err:
        with training_attention(Fixed(), resolve_attention("cpu", "fp32", "eager")):
            pass
    assert "leave finetune.attention auto" in err.value.hint
    model = Fixed()
    with training_attention(model, resolve_attention("cpu", "bf16")):  # auto -> eager, which it cannot run
        assert model.mlm_model.config._attn_implementation == "sdpa"
    assert "cannot switch to eager attention" in caplog.text
    with training_attention(Fixed(), resolve_attention("cpu", "fp32")), \
            training_attention(Fixed(), resolve_attention("cpu", "fp32", "sdpa")):
        pass  # nothing to switch


def test_the_cpu_optimizer_is_fused_and_trains_the_unfused_weights_up_to_rounding(make_tiny_clf, tmp_path,
                                                                                   monkeypatch):
    """AdamW's fused kernel on a CPU: one update for every tensor at once, the same arithmetic as the per-tensor
    loop; two epochs of the tiny model end within float rounding of the unfused run."""
    import ttt_pipeline.modeling.train as train

    made, adamw = [], torch.optim.AdamW

    def recording(params, *, fused_off: bool, **kw):
        opt = adamw(params, **{**kw, "fused": False if fused_off else kw.get("fused")})
        made.append(bool(opt.defaults.get("fused")))
        return opt

    weights = {}
    for off in (False, True):
        monkeypatch.setattr(train.torch.optim, "AdamW", lambda p, off=off, **kw: recording(p, fused_off=off, **kw))
        model, tok = make_tiny_clf(("neg", "pos"))
        cfg = FinetuneConfig(epochs=2, batch_size=8, lr=1e-3, early_stopping_patience=0, seed=0, precision="fp32",
                             mlm_warmup_max_steps=0, device="cpu")
        train.finetune(model, tok, _tiny_ds(tok, 4), _tiny_ds(tok, 4), cfg, tmp_path / f"fused-{not off}")
        weights[off] = torch.cat([q.detach().flatten() for q in model.parameters()])
    assert made == [True, False]
    assert not torch.equal(weights[False], weights[True])  # two kernels, not one run twice
    torch.testing.assert_close(weights[False], weights[True], rtol=1e-4, atol=1e-5)


def test_hidden_dropout_is_set_while_training_only_and_keys_the_fine_tune_only_when_set(make_tiny_clf, tmp_path,
                                                                                        monkeypatch):
    """finetune.hidden_dropout: the embeddings' and each layer's two output dropouts (not the attention
    probabilities') take the value during the epochs, the checkpoint's own afterwards; null trains as before the
    field existed and leaves the cache key as it was; a value outside [0, 1) or an encoder without such layers
    fails naming the field."""
    import ttt_pipeline.modeling.train as train
    from ttt_pipeline import steps
    from ttt_pipeline.config import PipelineConfig, load_config

    seen = []
    epoch = train._train_epoch

    def recording_epoch(loop, *args):
        seen.append(([d.p for d in train.hidden_dropouts(loop.model)],
                     [d.p for d in train.attention_dropouts(loop.model)]))
        return epoch(loop, *args)

    monkeypatch.setattr(train, "_train_epoch", recording_epoch)
    weights = {}
    for p in (None, 0.0):
        model, tok = make_tiny_clf(("neg", "pos"))
        own = [d.p for d in train.hidden_dropouts(model)]
        assert len(own) == 5 and set(own) == {0.1}  # embeddings, then two per layer of the tiny BERT's two
        cfg = FinetuneConfig(epochs=1, batch_size=8, lr=1e-3, early_stopping_patience=0, seed=0, precision="fp32",
                             mlm_warmup_max_steps=0, hidden_dropout=p)
        train.finetune(model, tok, _tiny_ds(tok, 4), None, cfg, tmp_path / str(p))
        assert [d.p for d in train.hidden_dropouts(model)] == own
        weights[p] = torch.cat([q.detach().flatten() for q in model.encoder.parameters()])
    assert seen == [([0.1] * 5, [0.1, 0.1]), ([0.0] * 5, [0.1, 0.1])]
    assert not torch.equal(weights[None], weights[0.0])

    class Out:
        digest = "d"

    assert "hidden_dropout" not in steps.finetune_inputs(PipelineConfig(), Out(), Out())["finetune"]
    on = load_config(None, ["finetune.hidden_dropout=0"])
    assert steps.finetune_inputs(on, Out(), Out())["finetune"]["hidden_dropout"] == 0.0
    with pytest.raises(ConfigError, match="finetune.hidden_dropout"):
        load_config(None, ["finetune.hidden_dropout=1"])

    class NoDropout(torch.nn.Module):
        encoder = torch.nn.Linear(2, 2)

    with pytest.raises(ConfigError, match="finetune.hidden_dropout") as err:
        with train.training_hidden_dropout(NoDropout(), 0.0):
            pass
    assert "null" in err.value.hint
