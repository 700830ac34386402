"""tent_filtered: Tent with the EATA/SAR reliability filter and SAR's reset, on the encoder's LayerNorms.

Per unit and step, as Tent (`ttt_pipeline.defenses.tent`: entropy minimisation of the LayerNorm affine parameters at
`ttt.tent.lr` for `ttt.tent.steps` steps, episodic unless `ttt.online`; it has Tent's settings, `Settings` below), except:

- reliability filter (EATA, Niu et al., ICML 2022; kept by SAR, Niu et al., ICLR 2023): only reviews whose
  prediction entropy is below E0 = MARGIN x ln(number of classes), MARGIN = 0.4 (EATA's default), contribute
  to the loss; high-entropy reviews, whose gradients are the noisy ones, are skipped. A unit with no reliable
  review takes no step (its prediction is the source model's). The loss is the entropy summed over the reliable
  reviews divided by the unit's size: SAR's mean over the reliable reviews up to a constant factor, which Adam's
  step does not see, and which keeps sub-batches (`sub_batch_tokens`) exact;
- reset on collapse (SAR's model recovery): an exponential moving average (weight 0.1 on the newest unit, as SAR)
  of the adapted predictions' mean entropy over the unit's reliable reviews is kept across units; when it falls
  below RESET_FRACTION x ln(number of classes) the predictions have collapsed onto confident classes, so the
  unit is predicted with the source weights (online: the source weights are restored and adaptation starts
  again) and the average restarts. SAR resets below 0.2 nats with 1,000 ImageNet classes; RESET_FRACTION =
  0.2 / ln(1000) scales that to any number of classes.

LayerNorm parameters only (`ttt_params.layernorm_parameters`), as Tent and SAR on transformers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ttt_pipeline.defenses.base import EngineSettings
from ttt_pipeline.defenses.tent import Settings, TentEngine

MARGIN = 0.4
RESET_FRACTION = 0.2 / math.log(1000)
EMA = 0.1  # weight of the newest unit in the moving average (SAR: 0.9 x old + 0.1 x new)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of each row's class distribution."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


class FilteredTent(TentEngine):
    """Tent on the reliable reviews only, with SAR's reset (see the module docstring).

    `margin` and `reset_below` are absolute thresholds in nats (default: the fractions above x ln(classes));
    `reset_below=0` turns the reset off."""

    def __init__(self, model, settings: EngineSettings, own: Settings | None = None, margin: float | None = None,
                 reset_below: float | None = None):
        super().__init__(model, settings, own)
        self.guard = None  # this engine's own reset rule replaces the online collapse guard
        self.margin, self.reset_below = margin, reset_below
        self.ema: float | None = None
        self._reliable: torch.Tensor | None = None
        self.stats.update({"reliable_rows": 0, "filtered_rows": 0})

    def thresholds(self, num_classes: int) -> tuple[float, float]:
        log_c = math.log(max(2, num_classes))
        margin = MARGIN * log_c if self.margin is None else float(self.margin)
        reset = RESET_FRACTION * log_c if self.reset_below is None else float(self.reset_below)
        return margin, reset

    def prepare(self, input_ids, attention_mask, step):
        first = self._reliable is None
        if first:
            self._reliable = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        return {"n": input_ids.shape[0], "record": first}

    def chunk_loss(self, input_ids, attention_mask, rows, ctx):
        logits = self.model(input_ids, attention_mask)
        ent = entropy(logits)
        reliable = ent.detach() < self.thresholds(logits.shape[-1])[0]
        if ctx["record"]:
            self._reliable[rows] = reliable
        n_reliable = int(reliable.sum())
        self.stats["reliable_rows"] += n_reliable
        self.stats["filtered_rows"] += int(reliable.numel()) - n_reliable
        if n_reliable == 0:
            return None
        return ent[reliable].sum() / ctx["n"]

    def _run_unit(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        self.stats["units"] += 1
        self._reliable = None
        self.adapt(input_ids, attention_mask)
        logits = self.forward_nograd(input_ids, attention_mask)
        reliable = self._reliable
        if reliable is not None and bool(reliable.any()):
            value = float(entropy(logits[reliable]).mean())
            self.ema = value if self.ema is None else (1 - EMA) * self.ema + EMA * value
            floor = self.thresholds(logits.shape[-1])[1]
            if self.ema < floor:
                self.reset_reasons.append(f"mean entropy of the reliable predictions collapsed "
                                          f"({self.ema:.4f} < {floor:.4f} nats)")
                self.stats["resets"] += 1
                self.ema = None
                self._restart()
                logits = self.forward_nograd(input_ids, attention_mask)
        if not self.s.online:
            self._restart()
        return logits


def build(model, tokenizer, settings: EngineSettings, own: Settings) -> FilteredTent:
    return FilteredTent(model, settings, own)
