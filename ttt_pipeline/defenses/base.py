"""What every episodic defense shares: settings, reproducible masks, the collapse guard and `EpisodicEngine`.

`EpisodicEngine` adapts chosen parameters on a self-supervised loss of each test unit, predicts, restores:

- episodic by default: while adapting, the chosen parameters are views into one flat buffer (so a restore
  is one kernel and an optimizer step a few, see `FlatParams`); after every unit (batch or sample) the
  buffer is refilled from the model's own, never-modified tensors and the optimizer's state is freed; with
  one step per unit that step is taken slice by slice, each slice's moments freed at once
  (`fresh_step_in_slices`); `predict` hands the model back on its own storage; no deepcopy of model or inputs;
- trailing padding columns are dropped, per-sample units run without padding, and optionally a unit runs
  in length-sorted sub-batches with accumulated gradients (`sub_batch_tokens`, same loss and step);
- no-grad work runs under `torch.inference_mode`; the engine autocasts to `amp`, the run's scoring precision that
  `registry.build_engine` hands it (`ttt.precision` resolved once, modeling/precision.py `Runtime`: auto is bf16 on
  CUDA and on CPUs with native bf16, about 1.6x faster there with logits within about 1e-2 of fp32, and fp32 on
  other CPUs); fp32 (an engine built directly, `amp` None) is the parity setting.

Masks are reproducible without any global RNG: each row's Bernoulli draws come from a generator seeded by
(seed, a stable hash of the row's own non-padding token ids, the draw index). A review therefore gets the
same masks alone, in any batch, at any padding length and in any evaluation order, which is what makes a
per-sample prediction independent of batch composition. The mask function is injectable (`mask_fn`).

`draws` > 1 repeats the episode on fresh masks from the same source weights and averages the class
probabilities of the draws (an ensemble of adapted models; `views` instead averages the loss of one step).

Online mode keeps the adapted weights (and optimizer moments) from unit to unit, guarded by
`CollapseGuard`, which restores the source weights when the loss diverges or collapses or when the
prediction entropy collapses (thresholds are `EngineSettings.guard_*`).

A defense subclasses `EpisodicEngine` with `prepare` (per-step context) and `chunk_loss` (its loss):
masked TTT in `masked_ttt.py`, Tent in `tent.py`.
"""

from __future__ import annotations

import hashlib
import math
import weakref
from contextlib import nullcontext
from typing import Callable, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator

from ttt_pipeline.defenses.params import (
    OPTIMIZERS,
    PARAM_SELECTIONS,
    FlatParams,
    drop_optimizer_state,
    fresh_step_in_slices,
    make_optimizer,
)
from ttt_pipeline.defenses.settings import DefenseSettings
from ttt_pipeline.modeling.model import eligible_positions

__all__ = ["DefenseSettings", "EngineSettings", "EpisodicEngine", "CollapseGuard", "RowHashMasker", "MaskFn",
           "trim_padding", "eligible_positions"]

# mask_fn(input_ids, attention_mask, draw) -> bool mask (B x T); `draw` numbers the masks of one unit
# ((draw * steps + step) * views + view) so that every draw, step and view gets fresh, reproducible masks.
MaskFn = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


class EngineSettings(DefenseSettings):
    """What every episodic engine shares (masked TTT, its recipes and control, Tent): `ttt.<knob>` in the config,
    where TTTConfig extends it, so an engine takes the validated `cfg.ttt` itself."""

    mask_prob: float = Field(0.1, gt=0, lt=1, description="Share of the tokens masked for each TTT step.")
    steps: int = Field(1, ge=1, description="Optimizer steps on the MLM loss per unit (batch or sample).")
    lr: float = Field(3e-5, gt=0, description="Learning rate of the TTT steps.")
    optimizer: Literal[OPTIMIZERS] = Field("adam", description="Optimizer of the TTT steps.")
    params: Literal[PARAM_SELECTIONS] = Field(
        "all", description="Parameters TTT adapts: all, the encoder LayerNorms, the last top_k encoder layers, the "
        "encoder biases, or lower_norm (LayerNorm and bias parameters of the lower half of the encoder layers).")
    top_k: int = Field(2, ge=1, description="Layers adapted when params=top_k.")
    views: int = Field(1, ge=1, description="Masked views per input per step (loss averaged).")
    draws: int = Field(1, ge=1, description="masked_ttt: independent adaptations per unit, each on its own masks "
                       "from the source weights; predicted probabilities averaged (episodic only).")
    unit: Literal["batch", "sample"] = Field("batch", description="Adapt per batch or per sample.")
    online: bool = Field(False, description="Keep adapted weights across units (with a collapse guard).")
    seed: int = Field(0, description="Seed of the TTT masks.")
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="auto: bf16 autocast on CUDA and on CPUs with native bf16 (logits within ~1e-2 of "
        "fp32), fp32 on other CPUs; fp32/bf16 force one.")
    signal_every: int = Field(
        0, ge=0, description="Masked TTT's held-out signal: on every n-th batch, the MLM loss on masks it does not "
        "step on, before and after adapting (the summary's ttt_heldout_*; two extra no-grad forwards per measured "
        "batch, predictions unchanged; episodic only). 0: off; 1: every batch.")
    trim_padding: bool = Field(True, description="Drop trailing padding columns before adapting (same logits).")
    sub_batch_tokens: int | None = Field(
        None, ge=0, description="Padded-token budget of the length-sorted sub-batches a unit is cut into "
        "(gradients accumulated: the math of one forward over the unit); null or 0: off. Off by default: it saves the "
        "padding's FLOPs, but on a busy shared CPU more, smaller kernels cost more (2048 was 1.3x slower than off "
        "on the 2-core bench machine under load).")
    # Online-mode collapse guard (CollapseGuard): baselines are the means over the first `guard_warmup` units
    # after a (re)start; the signals are exponential moving averages (weight `guard_ema` on the newest unit).
    guard: bool = Field(True, description="online: go back to the source weights when the MLM loss diverges "
                        "or collapses or the prediction entropy collapses (the guard_* thresholds).")
    guard_warmup: int = Field(4, ge=1, description="online: units whose means are the guard's baselines.")
    guard_ema: float = Field(0.3, gt=0, le=1, description="online: weight of the newest unit in the guard's "
                             "moving averages of MLM loss and normalised prediction entropy.")
    guard_loss_high: float = Field(1.5, gt=1, description="online: reset when the loss average exceeds this "
                                   "many times its baseline (divergence).")
    guard_loss_low: float = Field(0.25, gt=0, lt=1, description="online: reset when the loss average falls "
                                  "below this share of its baseline (the MLM task collapsed onto what it memorised).")
    guard_entropy_low: float = Field(0.2, gt=0, lt=1, description="online: reset when the entropy average falls "
                                     "below this share of its baseline (predictions collapsed onto one class).")

    @model_validator(mode="after")
    def _draws_are_episodic(self) -> "EngineSettings":
        if self.draws > 1 and self.online:
            raise ValueError("draws > 1 needs episodic TTT: set online: false or draws: 1 (each draw starts "
                             "from the source weights)")
        return self


def _row_key(tokens: np.ndarray) -> int:
    """Stable 63-bit hash of a row's token ids (independent of Python's hash seed and of padding)."""
    return int.from_bytes(hashlib.blake2b(tokens.astype(np.int64).tobytes(), digest_size=8).digest(), "little") >> 1


class RowHashMasker:
    """Bernoulli(mask_prob) over eligible tokens, each row drawn from its own generator seeded by
    (seed, hash of the row's non-padding ids, draw): batch-, padding- and order-independent masks."""

    def __init__(self, mask_prob: float, special_ids: list[int], seed: int = 0):
        self.mask_prob = mask_prob
        self.special_ids = list(special_ids)
        self.seed = int(seed)
        self._gen = torch.Generator()

    def row_seed(self, tokens: np.ndarray, draw: int) -> int:
        mix = (_row_key(tokens) ^ (self.seed * 0x9E3779B97F4A7C15) ^ ((draw + 1) * 0xBF58476D1CE4E5B9))
        return mix & ((1 << 63) - 1)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, draw: int = 0) -> torch.Tensor:
        ids = input_ids.detach().cpu().numpy()
        real = attention_mask.detach().cpu().numpy().astype(bool)
        rnd = np.ones(ids.shape, dtype=np.float32)
        for i in range(ids.shape[0]):
            pos = np.flatnonzero(real[i])
            if pos.size:
                self._gen.manual_seed(self.row_seed(ids[i, pos], draw))
                rnd[i, pos] = torch.rand(pos.size, generator=self._gen).numpy()
        mask = torch.from_numpy(rnd < self.mask_prob).to(input_ids.device)
        return mask & eligible_positions(input_ids, attention_mask, self.special_ids)


class CollapseGuard:
    """Decides when an online engine must go back to the source weights (see EngineSettings.guard_*)."""

    def __init__(self, warmup: int = 4, ema: float = 0.3, loss_high: float = 1.5, loss_low: float = 0.25,
                 entropy_low: float = 0.2):
        self.warmup, self.ema = max(1, warmup), ema
        self.loss_high, self.loss_low, self.entropy_low = loss_high, loss_low, entropy_low
        self.restart()

    def restart(self) -> None:
        self.n = 0
        self._loss_sum = self._ent_sum = 0.0
        self._loss_n = 0
        self.base_loss = self.base_entropy = None
        self.ema_loss = self.ema_entropy = None

    def _smooth(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.ema) * old + self.ema * new

    def update(self, loss: float | None, entropy: float) -> str | None:
        """Feed one unit's first-step MLM loss (None if nothing was masked) and mean normalised entropy;
        returns the reason to reset, or None."""
        if loss is not None and not math.isfinite(loss):
            return f"MLM loss is {loss}"
        if not math.isfinite(entropy):
            return f"prediction entropy is {entropy}"
        self.n += 1
        if loss is not None:
            self.ema_loss = self._smooth(self.ema_loss, loss)
        self.ema_entropy = self._smooth(self.ema_entropy, entropy)
        if self.n <= self.warmup:
            if loss is not None:
                self._loss_sum += loss
                self._loss_n += 1
            self._ent_sum += entropy
            if self.n == self.warmup:
                self.base_loss = self._loss_sum / self._loss_n if self._loss_n else None
                self.base_entropy = self._ent_sum / self.n
            return None
        if self.base_loss is not None and self.ema_loss is not None:
            if self.ema_loss > self.loss_high * self.base_loss:
                return f"MLM loss diverged ({self.ema_loss:.3f} > {self.loss_high} x {self.base_loss:.3f})"
            if self.ema_loss < self.loss_low * self.base_loss:
                return f"MLM loss collapsed ({self.ema_loss:.3f} < {self.loss_low} x {self.base_loss:.3f})"
        if self.base_entropy and self.ema_entropy < self.entropy_low * self.base_entropy:
            return (f"prediction entropy collapsed ({self.ema_entropy:.3f} < {self.entropy_low} x "
                    f"{self.base_entropy:.3f})")
        return None


def normalized_entropy(logits: torch.Tensor) -> float:
    """Mean prediction entropy over the unit, divided by log(num_classes) (1 = uniform, 0 = one-hot)."""
    logp = F.log_softmax(logits.float(), dim=-1)
    ent = -(logp.exp() * logp).sum(-1).mean()
    return float(ent) / math.log(max(2, logits.shape[-1]))


class EpisodicEngine:
    """Shared machinery: units, sub-batches, adapt-predict-restore, online mode with the guard, statistics.

    A unit (the batch, or one sample) is cut to its longest row and, when `sub_batch_tokens` > 0, split
    into length-sorted sub-batches of at most that many padded tokens: the unit's loss is the sum of the
    sub-batches' shares, so gradients accumulate (one optimizer step per unit and step, as with one big
    forward) while padding is not computed and each sub-batch's graph is freed before the next is built.

    Subclasses set `self.steps` and implement `prepare(ids, am, step)` (unit-wide work such as masks;
    None = nothing to learn from) and `chunk_loss(ids, am, rows, ctx)` (that sub-batch's share of the loss).
    """

    steps: int = 1
    draws: int = 1  # episodic adaptations per unit, probabilities averaged (MaskedTTT: EngineSettings.draws)

    def __init__(self, model, settings: EngineSettings, params: list[torch.nn.Parameter], lr: float):
        # An engine left attached (online mode) holds the model's parameters as views of its buffer; the next
        # engine must start from the model's own storage and the source values.
        previous = getattr(model, "_ttt_attached_engine", None)
        previous = previous() if previous is not None else None
        if previous is not None:
            previous.close()
        self.model = model
        self.s = settings
        self.params = list(params)
        if not self.params:
            raise ValueError(f"{type(self).__name__}: no parameters selected to adapt")
        wanted = {id(p) for p in self.params}
        self._all = list(model.parameters())
        self._frozen = [p for p in self._all if id(p) not in wanted]
        self.flat = FlatParams(self.params)
        self.opt = make_optimizer(self.flat.flat, settings.optimizer, lr)
        self.device = self.params[0].device
        # the autocast dtype (None: fp32); registry.build_engine sets the run's scoring precision (Runtime.score)
        self.amp = None
        sub = settings.sub_batch_tokens
        self.sub_batch_tokens = 0 if sub is None else int(sub)
        self.guard = (CollapseGuard(settings.guard_warmup, settings.guard_ema, settings.guard_loss_high,
                                    settings.guard_loss_low, settings.guard_entropy_low)
                      if settings.online and settings.guard else None)
        self.stats = {"units": 0, "steps": 0, "resets": 0, "loss_sum": 0.0, "loss_n": 0, "heldout": []}
        self.reset_reasons: list[str] = []

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp) if self.amp is not None else nullcontext()

    # -- episodes -------------------------------------------------------------------------------------
    def _attach(self) -> None:
        self.flat.attach()
        self.model.__dict__["_ttt_attached_engine"] = weakref.ref(self)

    def _detach(self) -> None:
        self.flat.detach()
        ref = self.model.__dict__.get("_ttt_attached_engine")
        if ref is not None and ref() is self:
            del self.model.__dict__["_ttt_attached_engine"]

    def _restart(self) -> None:
        """Source values into the buffer, optimizer state dropped (see drop_optimizer_state), guard restarted."""
        self.flat.restore()
        drop_optimizer_state(self.opt)
        if self.guard is not None:
            self.guard.restart()

    def reset(self) -> None:
        """Back to the source weights (the model's own, untouched storage) and a fresh optimizer."""
        self._restart()
        self._detach()

    def close(self) -> None:
        """Give the model back with its source weights (needed after online mode; harmless otherwise)."""
        self.reset()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def prepare(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, step: int):
        return {}

    def chunk_loss(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: torch.Tensor, ctx):
        raise NotImplementedError

    def probe(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """Context of a held-out measurement of this unit (masks it will not step on); None: no probe."""
        return None

    def probe_loss(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, ctx) -> float:
        """The self-supervised loss on the probe's held-out masks under the current weights."""
        raise NotImplementedError

    def _probe_before(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        every = self.s.signal_every
        if not every or (self.stats["units"] - 1) % every:
            return None
        ctx = self.probe(input_ids, attention_mask)
        if ctx is not None:
            ctx["before"] = self.probe_loss(input_ids, attention_mask, ctx)
        return ctx

    def chunks(self, attention_mask: torch.Tensor) -> list[torch.Tensor]:
        """Row indices of the sub-batches: rows sorted by length, grouped while rows x longest row stays
        within `sub_batch_tokens` (0: the whole unit as one chunk)."""
        n = attention_mask.shape[0]
        budget = self.sub_batch_tokens
        if budget <= 0 or n == 1 or n * attention_mask.shape[1] <= budget:
            return [torch.arange(n, device=attention_mask.device)]
        lengths = attention_mask.sum(1)
        order = torch.argsort(lengths, stable=True)
        sizes, count = [], 0
        for length in lengths[order].tolist():
            if count and (count + 1) * length > budget:
                sizes.append(count)
                count = 0
            count += 1
        sizes.append(count)
        return list(order.split(sizes))

    def _slice(self, input_ids, attention_mask, rows):
        ids, am = input_ids[rows], attention_mask[rows]
        return trim_padding(ids, am) if self.s.trim_padding else (ids, am)

    def adapt(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, first_step: int = 0) -> float | None:
        """`steps` optimizer steps on the unit's loss, numbered from `first_step` for `prepare` (draw d of a
        unit starts at d x steps); returns the first step's loss (before any update).
        Leaves the model attached to the adapted buffer (predict restores, or call reset())."""
        self._attach()
        first = None
        flags = [p.requires_grad for p in self._all]
        for p in self._frozen:
            p.requires_grad_(False)
        for p in self.params:
            p.requires_grad_(True)
        parts = self.chunks(attention_mask)
        try:
            for step in range(first_step, first_step + self.steps):
                ctx = self.prepare(input_ids, attention_mask, step)
                if ctx is None:  # nothing to learn from (no maskable token): skip the step
                    continue
                total, any_part = 0.0, False
                self.flat.bind_grads()
                for rows in parts:
                    ids, am = self._slice(input_ids, attention_mask, rows)
                    with self._autocast():
                        loss = self.chunk_loss(ids, am, rows, ctx)
                    if loss is None:
                        continue
                    loss.backward()
                    total += float(loss.detach())
                    any_part = True
                if not any_part:  # a loss that ran backward reached an adapted parameter (only they need grads)
                    continue
                if self.steps == 1 and not self.s.online:  # the state lives for this step only
                    fresh_step_in_slices(self.opt)
                else:
                    self.opt.step()
                self.stats["steps"] += 1
                if first is None:
                    first = total
        finally:
            for p, f in zip(self._all, flags):
                p.requires_grad_(f)
            self.flat.unbind_grads()
        if first is not None:
            self.stats["loss_sum"] += first
            self.stats["loss_n"] += 1
        return first

    def forward_nograd(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Class logits under inference_mode, sub-batch by sub-batch, back in the input's row order."""
        parts = self.chunks(attention_mask)
        with torch.inference_mode(), self._autocast():
            if len(parts) == 1:
                ids, am = self._slice(input_ids, attention_mask, parts[0])
                logits = self.model(ids, am).float()
                if not torch.equal(parts[0], torch.arange(len(parts[0]), device=parts[0].device)):
                    logits = logits[torch.argsort(parts[0])]
            else:
                outs = [self.model(*self._slice(input_ids, attention_mask, rows)).float() for rows in parts]
                logits = torch.empty(input_ids.shape[0], outs[0].shape[-1], device=outs[0].device)
                logits[torch.cat(parts)] = torch.cat(outs)
        return logits.clone()  # a normal tensor again (inference tensors cannot enter autograd later)

    # -- prediction -----------------------------------------------------------------------------------
    def predict(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Class logits (float32) after adapting on each unit; weights restored afterwards unless online."""
        out_device = input_ids.device
        input_ids = input_ids.to(self.device)
        attention_mask = attention_mask.to(self.device)
        was_training = self.model.training
        self.model.eval()  # dropout off, as torch-ttt's engine in eval mode
        self._attach()
        try:
            if self.s.unit == "sample":
                outs = []
                for i in range(input_ids.shape[0]):
                    keep = attention_mask[i].bool()
                    ids = input_ids[i, keep].unsqueeze(0)
                    outs.append(self._run_unit(ids, torch.ones_like(ids)))
                logits = torch.cat(outs)
            else:
                logits = self._run_unit(input_ids, attention_mask)
        finally:
            self.model.train(was_training)
            if not self.s.online:
                self._detach()
        return logits.to(out_device)

    __call__ = predict

    def _run_unit(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        self.stats["units"] += 1
        if not self.s.online:
            return self._run_draws(input_ids, attention_mask)
        loss = self.adapt(input_ids, attention_mask)
        logits = self.forward_nograd(input_ids, attention_mask)
        if self.guard is not None:
            reason = self.guard.update(loss, normalized_entropy(logits))
            if reason is not None:  # redo this unit from the source weights; the guard restarts from it
                self.reset_reasons.append(reason)
                self.stats["resets"] += 1
                self._restart()
                loss = self.adapt(input_ids, attention_mask)
                logits = self.forward_nograd(input_ids, attention_mask)
                self.guard.update(loss, normalized_entropy(logits))
        return logits

    def _run_draws(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Episodic: adapt, predict, restore, once per draw; one draw returns its logits unchanged."""
        probs = 0.0
        probe = self._probe_before(input_ids, attention_mask)
        for draw in range(self.draws):
            self.adapt(input_ids, attention_mask, first_step=draw * self.steps)
            if draw == 0 and probe is not None:  # the adapted weights, before the prediction restores them
                self.stats["heldout"].append((probe["before"], self.probe_loss(input_ids, attention_mask, probe)))
            logits = self.forward_nograd(input_ids, attention_mask)
            self._restart()
            if self.draws == 1:
                return logits
            probs = probs + logits.softmax(-1)
        return (probs / self.draws).log()

    @property
    def mean_loss(self) -> float | None:
        return self.stats["loss_sum"] / self.stats["loss_n"] if self.stats["loss_n"] else None


def trim_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop trailing columns that are padding in every row (positions of real tokens are unchanged)."""
    cols = attention_mask.bool().any(0).nonzero()
    if cols.numel() == 0:
        return input_ids, attention_mask
    end = int(cols[-1]) + 1
    if end == input_ids.shape[1]:
        return input_ids, attention_mask
    return input_ids[:, :end], attention_mask[:, :end]
