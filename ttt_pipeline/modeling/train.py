"""Fine-tuning that keeps the MLM task aligned with the classifier, so test-time training has a signal.

Stages: MLM-head warm-up (encoders shipped without a head; stops at a plateau), optional domain-adaptive MLM
(`dapt`, on the training and optional unlabeled texts), then classification epochs with weighted,
length-grouped batches and dynamic padding; in `joint` mode, and in `dapt` with mlm_weight > 0, each step adds
mlm_weight x the MLM loss of a masked copy of the batch. Each completed epoch
is checkpointed atomically, so a killed run resumes where it stopped.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Sampler

from ttt_pipeline.errors import ConfigError
from ttt_pipeline.metrics import summarize
from ttt_pipeline.modeling.model import (
    ReviewClassifier,
    eligible_positions,
    pick_device,
    special_token_ids,
)
from ttt_pipeline.modeling.precision import Runtime, resolve_runtime
from ttt_pipeline.storage import atomic_write_text

log = logging.getLogger(__name__)
Progress = Callable[[str, int, int, dict], None]


def set_threads() -> int:
    """All cores of the machine (or the cgroup's share) for intra-op work, split evenly between the ranks of a
    data-parallel job on this node (LOCAL_WORLD_SIZE, set by torchrun), so the ranks do not oversubscribe them."""
    from ttt_pipeline.cores import available_cores

    n = max(1, available_cores() // int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("TTT_DDP_LOCAL_WORLD", "1"))))
    torch.set_num_threads(n)
    return n


def class_weights(labels: list[int], n: int) -> torch.Tensor:
    counts = np.bincount(np.asarray(labels), minlength=n).astype(float)
    w = np.where(counts > 0, counts.sum() / (n * np.maximum(counts, 1)), 0.0)
    return torch.tensor(w, dtype=torch.float32)


class WeightedLengthGroupedBatches(Sampler[list[int]]):
    """Weighted sampling with replacement (as WeightedRandomSampler), then batches of similar lengths.

    Drawn indices are cut into mega-batches of `group` batches, sorted by length inside each, split into
    batches, and the batch order shuffled: the class balance of the weighted sampler is kept while padding
    shrinks. Epoch e uses generator seed+e, so a resumed run draws the same batches.
    """

    def __init__(self, weights: torch.Tensor | None, lengths: list[int], batch_size: int, seed: int,
                 grouped: bool = True, group: int = 50):
        self.weights = weights
        self.lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.seed = seed
        self.grouped = grouped
        self.group = group
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        n = len(self.lengths)
        if self.weights is not None:
            idx = torch.multinomial(self.weights, n, replacement=True, generator=g).numpy()
        else:
            idx = torch.randperm(n, generator=g).numpy()
        if self.grouped:
            mega = self.batch_size * self.group
            chunks = [idx[i:i + mega] for i in range(0, n, mega)]
            idx = np.concatenate([c[np.argsort(-self.lengths[c], kind="stable")] for c in chunks])
        batches = [idx[i:i + self.batch_size].tolist() for i in range(0, n, self.batch_size)]
        order = torch.randperm(len(batches), generator=g).tolist() if self.grouped else range(len(batches))
        for i in order:
            yield batches[i]


def make_collate(tokenizer):
    pad_id = tokenizer.pad_token_id

    def collate(rows: list[dict]) -> dict[str, torch.Tensor]:
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
            mask[i, : len(r["input_ids"])] = 1
        out = {"input_ids": ids, "attention_mask": mask}
        if "label" in rows[0]:
            out["labels"] = torch.tensor([r["label"] for r in rows], dtype=torch.long)
        return out

    return collate


def mlm_mask(input_ids, attention_mask, special: list[int], prob: float, gen: torch.Generator) -> torch.Tensor:
    """Bernoulli(prob) over eligible tokens, at least one per row so every review contributes."""
    ok = eligible_positions(input_ids, attention_mask, special)
    mask = (torch.rand(input_ids.shape, generator=gen) < prob) & ok
    empty = ~mask.any(1) & ok.any(1)
    if empty.any():
        scores = torch.rand(input_ids.shape, generator=gen).masked_fill(~ok, -1.0)
        first = scores.argmax(1)
        mask[empty, first[empty]] = True
    return mask


def mlm_loss(model: ReviewClassifier, input_ids, attention_mask, mask, mask_token_id: int):
    masked = input_ids.masked_fill(mask, mask_token_id)
    hidden = model.encode(masked, attention_mask)
    return model.mlm_cross_entropy(hidden, input_ids, mask)


def optimizer_step(loss, opt, scaler, params, max_grad_norm: float | None) -> None:
    """One step: backward (scaled: fp16 gradients underflow unscaled; a no-op scaler otherwise; under
    DistributedDataParallel the backward also averages the gradients across ranks), optional clipping of the
    unscaled gradients, then the optimizer."""
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    if max_grad_norm is not None:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    scaler.step(opt)
    scaler.update()


@dataclass
class TrainResult:
    history: list[dict] = field(default_factory=list)
    warmup_curve: list[float] = field(default_factory=list)
    dapt_curve: list[float] = field(default_factory=list)
    best_epoch: int = 0
    best_val_macro_f1: float = float("nan")
    train_samples_per_s: float = 0.0
    resumed_from_epoch: int = 0
    stopped_early: bool = False


def _loader(ds, sampler, collate, workers: int):
    return torch.utils.data.DataLoader(ds, batch_sampler=sampler, collate_fn=collate, num_workers=workers,
                                       persistent_workers=False)


def default_workers(n_rows: int) -> int:
    """Collation is cheap here; workers only pay on GPU hosts with spare cores."""
    if not torch.cuda.is_available():
        return 0
    return min(4, max(0, (os.cpu_count() or 1) // 2))


def warmup_mlm_head(model, tokenizer, ds, cfg, device, progress: Progress | None = None) -> list[float]:
    """Train only the MLM head (the encoder's layers frozen) until its loss plateaus: an untrained head makes TTT
    noise. Where the head's decoder is tied to the input word embeddings (BERT, MiniLM), training it moves those
    embeddings too, so the encoder's input changes; every preset's figures were measured this way."""
    special = special_token_ids(tokenizer)
    head_params = model.mlm_head.parameters_of_head()
    for p in model.parameters():
        p.requires_grad_(False)
    for p in head_params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(head_params, lr=cfg.mlm_warmup_lr)
    gen = torch.Generator().manual_seed(cfg.seed + 101)
    sampler = WeightedLengthGroupedBatches(None, ds["length"], cfg.batch_size, cfg.seed + 7)
    collate = make_collate(tokenizer)
    curve: list[float] = []
    best, since_best, step, ema = float("inf"), 0, 0, None
    model.eval()  # dropout off: the encoder is a fixed feature extractor here
    while step < cfg.mlm_warmup_max_steps:
        sampler.set_epoch(step)
        for batch in _loader(ds, sampler, collate, 0):
            ids, am = batch["input_ids"].to(device), batch["attention_mask"].to(device)
            mask = mlm_mask(ids.cpu(), am.cpu(), special, cfg.mlm_prob, gen).to(device)
            with torch.no_grad():
                hidden = model.encode(ids.masked_fill(mask, tokenizer.mask_token_id), am)
            loss = model.mlm_cross_entropy(hidden, ids, mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            value = loss.item()
            curve.append(value)
            ema = value if ema is None else 0.9 * ema + 0.1 * value
            step += 1
            if ema < best * 0.99:
                best, since_best = ema, 0
            else:
                since_best += 1
            if progress:
                progress("mlm_warmup", step, cfg.mlm_warmup_max_steps, {"mlm_loss": ema})
            if since_best >= cfg.mlm_warmup_patience or step >= cfg.mlm_warmup_max_steps:
                break
        if since_best >= cfg.mlm_warmup_patience:
            break
    for p in model.parameters():
        p.requires_grad_(True)
    return curve


def dapt(model, tokenizer, ds, cfg, device, progress: Progress | None = None,
         amp: torch.dtype | None = None) -> list[float]:
    """Domain-adaptive MLM on the training (and unlabeled) texts: encoder and head re-learn the MLM task.
    Runs under the fine-tuning's autocast (`amp`), so bf16 speeds it up as much as the epochs."""
    scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)
    special = special_token_ids(tokenizer)
    params = [p for p in model.mlm_model.parameters()]
    opt = torch.optim.AdamW(params, lr=cfg.dapt_lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed + 202)
    sampler = WeightedLengthGroupedBatches(None, ds["length"], cfg.batch_size, cfg.seed + 11)
    collate = make_collate(tokenizer)
    curve = []
    model.train()
    total = cfg.dapt_epochs * len(sampler)
    for epoch in range(cfg.dapt_epochs):
        sampler.set_epoch(epoch)
        for batch in _loader(ds, sampler, collate, 0):
            ids, am = batch["input_ids"].to(device), batch["attention_mask"].to(device)
            mask = mlm_mask(ids.cpu(), am.cpu(), special, cfg.mlm_prob, gen).to(device)
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                loss = mlm_loss(model, ids, am, mask, tokenizer.mask_token_id)
            optimizer_step(loss, opt, scaler, params, cfg.max_grad_norm)
            curve.append(loss.item())
            if progress:
                progress("dapt", len(curve), total, {"mlm_loss": curve[-1]})
    return curve


@torch.no_grad()
def evaluate_split(model, tokenizer, ds, batch_size: int, device, weights: torch.Tensor | None = None) -> dict:
    """Validation loss, accuracy and macro-F1 (batches sorted by length: no padding waste)."""
    model.eval()
    order = np.argsort(-np.asarray(ds["length"]), kind="stable")
    collate = make_collate(tokenizer)
    preds, labels, loss_sum = [], [], 0.0
    for i in range(0, len(order), batch_size):
        rows = [ds[int(j)] for j in order[i:i + batch_size]]
        b = collate(rows)
        logits = model(b["input_ids"].to(device), b["attention_mask"].to(device)).float()
        y = b["labels"].to(device)
        loss_sum += float(F.cross_entropy(logits, y, weight=None if weights is None else weights.to(device),
                                          reduction="sum"))
        preds.extend(logits.argmax(-1).tolist())
        labels.extend(y.tolist())
    out = summarize(labels, preds, model.meta.num_labels)
    out["loss"] = loss_sum / max(1, len(labels))
    return out


def attention_dropouts(model) -> list[torch.nn.Dropout]:
    """The dropout on attention probabilities of a BERT-style encoder (BERT, RoBERTa, MiniLM, ELECTRA): each
    self-attention module's `dropout`, which transformers passes to the fused attention while training."""
    return [m.dropout for m in model.encoder.modules()
            if type(m).__name__.endswith("SelfAttention") and isinstance(getattr(m, "dropout", None), torch.nn.Dropout)]


def hidden_dropouts(model) -> list[torch.nn.Dropout]:
    """The encoder's other dropout layers: on the embeddings and on each layer's attention output and feed-forward
    output (the hidden states), every `nn.Dropout` of the encoder that is not an attention-probability dropout."""
    attention = {id(d) for d in attention_dropouts(model)}
    return [m for m in model.encoder.modules() if isinstance(m, torch.nn.Dropout) and id(m) not in attention]


@contextmanager
def training_attention_dropout(model, p: float | None):
    """`finetune.attention_dropout` while training, the checkpoint's own value again afterwards (a saved model and
    test-time training see what they always saw). None changes nothing."""
    with _dropout_set(model, attention_dropouts, p, "attention_dropout", "attention dropout this pipeline can set "
                      "(a BERT-style SelfAttention.dropout)"):
        yield


@contextmanager
def training_hidden_dropout(model, p: float | None):
    """`finetune.hidden_dropout` while training (hidden_dropouts), the checkpoint's own values again afterwards.
    None changes nothing."""
    with _dropout_set(model, hidden_dropouts, p, "hidden_dropout", "dropout layer on its hidden states"):
        yield


@contextmanager
def _dropout_set(model, layers_of, p: float | None, field: str, what: str):
    if p is None:
        yield
        return
    layers = layers_of(model)
    if not layers:
        raise ConfigError(f"finetune.{field}: the encoder ({type(model.encoder).__name__}) has no {what}",
                          f"leave finetune.{field} null for this model")
    before = [d.p for d in layers]
    for d in layers:
        d.p = p
    try:
        yield
    finally:
        for d, q in zip(layers, before):
            d.p = q


@contextmanager
def training_attention(model, attention):
    """The encoder's attention implementation (resolve_attention's `attention.name`: eager, sdpa) while training, its
    own again afterwards, so a saved model and test-time training run as they always did. None changes nothing; an
    encoder that cannot switch keeps its own under auto and is an error when the user asked for it."""
    encoder, name = model.mlm_model, attention.name
    before = getattr(encoder.config, "_attn_implementation", None)
    if name is None or name == before:
        yield
        return
    setter = getattr(encoder, "set_attn_implementation", None)
    if setter is not None:
        setter(name)  # transformers only warns when the model cannot switch: checked below
    if getattr(encoder.config, "_attn_implementation", None) != name:
        if attention.explicit:
            raise ConfigError(f"finetune.attention={name}: the encoder ({type(encoder).__name__}) cannot switch its "
                              f"attention to {name} (it runs {before})", "leave finetune.attention auto for this model")
        log.warning("finetune.attention=auto: the encoder (%s) cannot switch to %s attention; it trains with its "
                    "own (%s)", type(encoder).__name__, name, before)
        yield
        return
    try:
        yield
    finally:
        encoder.set_attn_implementation(before)


@contextmanager
def training_checkpointing(model, on: bool):
    """transformers' activation checkpointing of the encoder while training (non-reentrant, the RNG state kept, so
    the recomputed forward draws the same dropout), then off again, with the embedding-output hook transformers 5
    adds when enabling (it makes the embeddings' output require grad) removed too: afterwards the model is as
    before. `activation_checkpointing_*` from transformers 5, `gradient_checkpointing_*` before it."""
    if not on:
        yield
        return
    encoder = model.mlm_model
    if not getattr(encoder, "supports_gradient_checkpointing", False):
        raise ConfigError(f"finetune.activation_checkpointing: the encoder ({type(encoder).__name__}) does not "
                          "support activation checkpointing", "set finetune.activation_checkpointing=false")
    hooked = _input_grads_hooked(encoder)
    kwargs = {"use_reentrant": False}
    if hasattr(encoder, "activation_checkpointing_enable"):
        encoder.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        encoder.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    try:
        yield
    finally:
        if hasattr(encoder, "activation_checkpointing_disable"):
            encoder.activation_checkpointing_disable()
        else:
            encoder.gradient_checkpointing_disable()
        if not hooked and _input_grads_hooked(encoder):
            encoder.disable_input_require_grads()


def _input_grads_hooked(encoder) -> bool:
    """Whether transformers' `enable_input_require_grads` hook is on the encoder's embeddings (5.x keeps a list,
    4.x one handle)."""
    return bool(getattr(encoder, "_require_grads_hooks", None) or getattr(encoder, "_require_grads_hook", None))


def _save_checkpoint(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _align(model, tokenizer, train_ds, cfg, device, amp, progress, unlabeled_ds, result: TrainResult) -> None:
    """Before the classification epochs (a fresh run only): warm up an untrained MLM head, then DAPT."""
    if not model.meta.mlm_head_pretrained and not model.meta.mlm_head_trained and cfg.mlm_warmup_max_steps > 0:
        result.warmup_curve = warmup_mlm_head(model, tokenizer, train_ds, cfg, device, progress)
        model.meta.mlm_head_trained = True
    if cfg.alignment == "dapt" and cfg.dapt_epochs > 0:
        from datasets import concatenate_datasets

        cols = ["input_ids", "length"]
        mlm_ds = train_ds if unlabeled_ds is None else concatenate_datasets(
            [train_ds.select_columns(cols), unlabeled_ds.select_columns(cols)])
        result.dapt_curve = dapt(model, tokenizer, mlm_ds, cfg, device, progress, amp)


class TrainingLoss(torch.nn.Module):
    """One batch's training loss as a module: the cross-entropy, plus mlm_weight x the MLM loss of a masked copy
    of the batch when training is joint. The whole loss is computed in `forward`, as the Hugging Face Trainer
    does, so that data-parallel training wraps this module in DistributedDataParallel: the MLM term's pass
    through the encoder is part of the wrapped forward, and the reducer averages every gradient it produces."""

    def __init__(self, model: ReviewClassifier, tokenizer, cfg, joint: bool, amp: torch.dtype | None,
                 gen: torch.Generator, loss_w: torch.Tensor | None, compiled: torch.nn.Module | None = None):
        super().__init__()
        self.model = model
        # torch.compile'd classifier (cfg.compile) for the plain forward; held unregistered, as its parameters
        # are the model's own
        object.__setattr__(self, "_classify", model if compiled is None else compiled)
        self.cfg, self.joint, self.amp, self.gen, self.loss_w = cfg, joint, amp, gen, loss_w
        self.special, self.mask_id = special_token_ids(tokenizer), tokenizer.mask_token_id

    def _mask(self, ids, am) -> torch.Tensor:
        return mlm_mask(ids.cpu(), am.cpu(), self.special, self.cfg.mlm_prob, self.gen).to(ids.device)

    def forward(self, ids, am, y) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(loss to step on, its cross-entropy part, its MLM part or None when not joint); the parts detached."""
        model, cfg = self.model, self.cfg
        m_loss = None
        with torch.autocast(ids.device.type, dtype=self.amp, enabled=self.amp is not None):
            if self.joint and cfg.joint_passes == 1:
                mask = self._mask(ids, am)
                hidden = model.encode(ids.masked_fill(mask, self.mask_id), am)
                # the classifier pools over the unmasked tokens only: mean pooling would otherwise average in
                # [MASK] states that clean test inputs never have (the masking is then plain token dropout)
                logits = model.classify_hidden(hidden, am.masked_fill(mask, 0))
                loss = F.cross_entropy(logits.float(), y, weight=self.loss_w)
                m_loss = model.mlm_cross_entropy(hidden, ids, mask)
            else:
                loss = F.cross_entropy(self._classify(ids, am).float(), y, weight=self.loss_w)
                if self.joint:
                    m_loss = mlm_loss(model, ids, am, self._mask(ids, am), self.mask_id)
            ce = loss.detach()
            if m_loss is not None:
                loss = loss + cfg.mlm_weight * m_loss
        return loss, ce, None if m_loss is None else m_loss.detach()


@dataclass
class _Loop:
    """What the classification epochs share: the objects a checkpoint saves and restores."""

    model: ReviewClassifier
    tokenizer: object
    cfg: object
    device: torch.device
    amp: torch.dtype | None
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    sampler: Sampler
    weights: torch.Tensor
    gen: torch.Generator
    scaler: torch.amp.GradScaler
    batch_loss: torch.nn.Module  # the TrainingLoss; under `parallel`, its DistributedDataParallel wrapper
    joint: bool
    steps_total: int
    start_epoch: int = 0
    best_f1: float = -1.0
    bad_epochs: int = 0
    seen: int = 0
    t_train: float = 0.0


def trainable_parameters(model, mode: str) -> list[torch.nn.Parameter]:
    """full: every parameter. frozen_encoder (the TTT-MAE protocol): the classification head and the MLM head's
    own parameters (not the input embeddings BERT ties to its decoder) learn on the frozen body; the others stop
    taking gradients (`finetune` gives them back), so test-time training later moves a body the classifier was
    fitted to without changing it."""
    if mode == "full":
        return list(model.parameters())
    body = {id(p) for p in model.encoder.parameters()}
    keep = {id(p) for p in model.head.parameters()}
    keep |= {id(p) for p in model.mlm_head.parameters_of_head() if id(p) not in body}
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)
    return [p for p in model.parameters() if id(p) in keep]


def training_sampler(cfg, lengths: list[int], labels: list[int], weights: torch.Tensor) -> Sampler[list[int]]:
    """The batches fine-tuning draws: class-weighted when `weighted_sampler`, grouped by length."""
    return WeightedLengthGroupedBatches(weights[torch.tensor(labels)] if cfg.weighted_sampler else None, lengths,
                                        cfg.batch_size, cfg.seed, grouped=cfg.length_grouping,
                                        group=cfg.length_group_batches)


def joint_training(cfg) -> bool:
    """Whether each batch's loss adds the MLM term (joint alignment, or DAPT that keeps an MLM weight)."""
    return cfg.alignment == "joint" or (cfg.alignment == "dapt" and cfg.mlm_weight > 0)


def _build_loop(model, tokenizer, train_ds, cfg, device, amp, parallel) -> _Loop:
    """AdamW (no decay on biases and norms) over the mode's trainable parameters, the class-weighted
    length-grouped sampler, the batch loss (`TrainingLoss`, with its mask generator), the linear warm-up and
    decay schedule and the gradient scaler. `parallel.prepare` wraps the loss in DistributedDataParallel and
    shards the sampler; only a frozen (not joint) alignment leaves trainable parameters (the MLM head's) unused."""
    params = trainable_parameters(model, cfg.mode)
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    # fused: one kernel for the whole update instead of a loop of elementwise ops per tensor; the same AdamW up to
    # float rounding (tests/test_train.py), and on a CPU the per-step optimizer time was a quarter of a MiniLM step
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr,
                            fused=device.type in ("cuda", "cpu"))
    weights = class_weights(train_ds["label"], model.meta.num_labels)
    sampler = training_sampler(cfg, train_ds["length"], train_ds["label"], weights)
    joint = joint_training(cfg)
    gen = torch.Generator().manual_seed(cfg.seed + 303)
    batch_loss = TrainingLoss(model, tokenizer, cfg, joint, amp, gen,
                              weights.to(device) if cfg.class_weighted_loss else None,
                              torch.compile(model) if cfg.compile else None)
    if parallel is not None:
        batch_loss, sampler = parallel.prepare(batch_loss, sampler, find_unused_parameters=not joint)
    steps_total = cfg.epochs * len(sampler)
    warm = int(cfg.warmup_ratio * steps_total)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / max(1, warm) if s < warm else max(0.0, (steps_total - s) / max(1, steps_total - warm)))
    scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)  # fp16 gradients underflow unscaled
    return _Loop(model, tokenizer, cfg, device, amp, opt, sched, sampler, weights, gen, scaler, batch_loss, joint,
                 steps_total)


def _resume(loop: _Loop, resume: dict, work_dir: Path, result: TrainResult) -> None:
    """Weights, optimizer, schedule, every random state and the history from the last finished epoch."""
    loop.model.load_state_dict(resume["model"])
    loop.opt.load_state_dict(resume["optimizer"])
    loop.sched.load_state_dict(resume["scheduler"])
    torch.set_rng_state(resume["torch_rng"])
    cuda_rng = resume.get("cuda_rng") or []
    if cuda_rng and torch.cuda.is_available() and len(cuda_rng) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda_rng)  # dropout on the GPU draws from these
    loop.gen.set_state(resume["mask_rng"])
    loop.start_epoch, loop.best_f1 = int(resume["epoch"]), float(resume["best_f1"])
    loop.bad_epochs = int(resume["bad_epochs"])
    meta = json.loads((work_dir / "state.json").read_text())
    # state.json is written just before last.pt: a kill between the two leaves it one epoch ahead
    result.history = meta["history"][:loop.start_epoch]
    result.warmup_curve, result.dapt_curve = meta["warmup"], meta["dapt"]
    result.best_epoch = meta["best_epoch"]
    loop.model.meta.mlm_head_trained = meta["mlm_head_trained"]
    result.resumed_from_epoch = loop.start_epoch
    log.info("resuming fine-tuning after epoch %d", loop.start_epoch)


def _train_epoch(loop: _Loop, epoch: int, train_ds, workers: int, progress) -> dict:
    """One pass over the sampler's batches; the epoch's history row (losses, lr, speed)."""
    model, cfg, device = loop.model, loop.cfg, loop.device
    model.train()
    if cfg.mode == "frozen_encoder":
        model.mlm_model.eval()  # a fixed feature extractor: no dropout in the frozen body
    loop.sampler.set_epoch(epoch)
    t0 = time.perf_counter()
    ce_sum = mlm_sum = 0.0
    nb = 0
    for bi, batch in enumerate(_loader(train_ds, loop.sampler, make_collate(loop.tokenizer), workers)):
        ids, am, y = (batch[k].to(device, non_blocking=True) for k in ("input_ids", "attention_mask", "labels"))
        loss, ce, mlm = loop.batch_loss(ids, am, y)
        ce_sum += ce.item()
        if mlm is not None:
            mlm_sum += mlm.item()
        optimizer_step(loss, loop.opt, loop.scaler, model.parameters(), cfg.max_grad_norm)
        loop.sched.step()
        nb += 1
        loop.seen += len(y)
        if progress:
            progress("finetune", epoch * len(loop.sampler) + bi + 1, loop.steps_total, {"loss": loss.item()})
    dt = time.perf_counter() - t0
    loop.t_train += dt
    row = {"epoch": epoch + 1, "train_loss": ce_sum / max(1, nb), "lr": loop.sched.get_last_lr()[0],
           "epoch_s": dt, "samples_per_s": len(loop.sampler.lengths) / dt if dt > 0 else 0.0}
    if loop.joint:
        row["train_mlm_loss"] = mlm_sum / max(1, nb)
    return row


def _end_epoch(loop: _Loop, epoch: int, row: dict, val_ds, work_dir: Path, result: TrainResult) -> bool:
    """Validate, keep the best weights, write the resumable state; True when early stopping ends training."""
    model, cfg = loop.model, loop.cfg
    if val_ds is not None and len(val_ds):
        v = evaluate_split(model, loop.tokenizer, val_ds, cfg.batch_size * 2, loop.device, loop.weights)
        row.update({"val_loss": v["loss"], "val_acc": v["acc"], "val_macro_f1": v["macro_f1"]})
        improved = v["macro_f1"] > loop.best_f1 + 1e-9
    else:
        improved = True
    if improved:
        loop.best_f1 = row.get("val_macro_f1", loop.best_f1)
        loop.bad_epochs = 0
        result.best_epoch = epoch + 1
        _save_checkpoint(work_dir / "best.pt", {"model": model.state_dict()})
    else:
        loop.bad_epochs += 1
    result.history.append(row)
    log.info("epoch %d: %s", epoch + 1,  # 4 significant digits: a late-schedule lr (2.5e-05) is not 0.0
             {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in row.items()})
    atomic_write_text(work_dir / "state.json", json.dumps({  # atomic: a kill never leaves half a file
        "history": result.history, "warmup": result.warmup_curve, "dapt": result.dapt_curve,
        "best_epoch": result.best_epoch, "mlm_head_trained": model.meta.mlm_head_trained}))
    stop = cfg.early_stopping_patience > 0 and loop.bad_epochs >= cfg.early_stopping_patience
    _save_checkpoint(work_dir / "last.pt", {
        "model": model.state_dict(), "optimizer": loop.opt.state_dict(), "scheduler": loop.sched.state_dict(),
        "torch_rng": torch.get_rng_state(), "mask_rng": loop.gen.get_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "epoch": cfg.epochs if stop else epoch + 1, "best_f1": loop.best_f1, "bad_epochs": loop.bad_epochs})
    return stop


def _checkpointing(cfg) -> bool:
    """finetune.activation_checkpointing where it has work to do: a frozen encoder has no backward pass to save
    activations for, so there the setting is skipped with a note (a preset may turn it on for either mode)."""
    if cfg.activation_checkpointing and cfg.mode == "frozen_encoder":
        log.info("finetune.activation_checkpointing skipped: mode frozen_encoder runs no backward pass through the "
                 "encoder")
        return False
    return cfg.activation_checkpointing


def finetune(model: ReviewClassifier, tokenizer, train_ds, val_ds, cfg, work_dir: Path,
             progress: Progress | None = None, unlabeled_ds=None, parallel=None,
             runtime: Runtime | None = None) -> TrainResult:
    """Train in place; returns the history. `work_dir` holds resumable checkpoints (kept across crashes).

    Phases: MLM alignment (`_align`, a fresh run only), the training objects (`_build_loop`), a resumed state
    (`_resume`), then per epoch `_train_epoch` and `_end_epoch` (validation, best weights, checkpoint).

    `parallel` (optional, ttt_pipeline.modeling.data_parallel.DataParallel) makes the classification epochs
    data-parallel: `parallel.prepare(loss_module, sampler)` wraps the batch loss (`TrainingLoss`) in
    DistributedDataParallel, which starts every rank from rank 0's weights and averages the gradients during
    each backward, and gives this rank its share of the batches.

    `runtime`: the run's machine choices (device, precision, attention) as the pipeline resolved them; a caller
    that trains alone (a test, a bench) may leave it out, and the configuration's are resolved here."""
    set_threads()
    if runtime is None:  # first: an impossible choice fails before any work
        runtime = resolve_runtime(pick_device(cfg.device), cfg.precision, attention=cfg.attention)
    device, amp = runtime.device, runtime.train.dtype
    model.to(device)
    torch.manual_seed(cfg.seed)
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path, best_path = work_dir / "last.pt", work_dir / "best.pt"
    result = TrainResult()
    resume = torch.load(ckpt_path, map_location="cpu", weights_only=True) if ckpt_path.is_file() else None
    with training_attention(model, runtime.attention), training_attention_dropout(model, cfg.attention_dropout), \
            training_hidden_dropout(model, cfg.hidden_dropout), \
            training_checkpointing(model, _checkpointing(cfg)):
        if resume is None:
            _align(model, tokenizer, train_ds, cfg, device, amp, progress, unlabeled_ds, result)
        loop = _build_loop(model, tokenizer, train_ds, cfg, device, amp, parallel)
        if resume is not None:
            _resume(loop, resume, work_dir, result)
        workers = cfg.num_workers if cfg.num_workers is not None else default_workers(len(train_ds))
        for epoch in range(loop.start_epoch, cfg.epochs):
            row = _train_epoch(loop, epoch, train_ds, workers, progress)
            if _end_epoch(loop, epoch, row, val_ds, work_dir, result):
                result.stopped_early = True
                break
    if best_path.is_file():
        model.load_state_dict(torch.load(best_path, map_location="cpu", weights_only=True)["model"])
    result.best_val_macro_f1 = loop.best_f1
    result.train_samples_per_s = loop.seen / loop.t_train if loop.t_train > 0 else 0.0
    for p in model.parameters():  # frozen_encoder froze the body for training only
        p.requires_grad_(True)
    model.eval()
    return result
