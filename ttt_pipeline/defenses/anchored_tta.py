"""anchored_tta: test-time adaptation on the classifier's own predictions, anchored to the frozen model.

Per unit (batch or sample), episodic: the encoder's LayerNorm affine parameters and biases take
`ttt.anchored_tta.steps` optimizer steps (`ttt.optimizer`, at `ttt.anchored_tta.lr`) on

    loss = [(1 - a) x sum over confident reviews of mean over views KL(p_orig || p_view)
            + a x sum over all reviews of KL(p_source || p_orig)] / reviews in the unit,

the unit is predicted with the adapted weights, and the weights are restored (`EpisodicEngine`). Here p_orig is
the class distribution of the review under the current weights, p_view that of one of its `views` perturbed
copies, p_source that of the review under the frozen (source) weights, and a = `anchor_weight`.

Where it comes from, and why each choice:

- PCL (Su et al. 2023, "Test-time adaptation with perturbation consistency learning"): comparing Tent and OIL
  on pre-trained language models, it finds that stable prediction is the key to gaining without OIL's cost, so
  it turns dropout off at test time and adapts on a KL consistency between the model's output on an input and
  on a randomly perturbed copy of its features. Here: eval mode throughout (no dropout noise in the targets),
  and the consistency term above, its perturbation token masking (the views below) and its target the
  review's own prediction (detached: the views move toward the review, not the other way round).
- Views: each is the review with a share `view_mask_rate` of its tokens replaced by the tokenizer's mask
  token (its unknown token where it has none), drawn by the row-hash masker of defenses/base.py, seeded by
  `ttt.seed`, draws 0 .. views-1, the same views at every step. A review therefore gets the same views alone,
  in any batch and at any padding (its result does not depend on its neighbours), and the result depends on
  the mask seed (the registry scores it once per `ttt.mask_seeds` entry). Masking is the perturbation closest
  to what noise does to a review (a word the model cannot read) and needs no MLM head: only the classifier's
  logits are used, so any classifier runs it (`SequenceClassifier` included).
- Confidence filter (as FixMatch's threshold, and EATA/SAR's reliable-sample filter): only reviews whose
  current prediction has a top probability of at least `confidence` supply consistency targets; a
  near-chance prediction is no target worth copying, and its gradients are the noisy ones.
- Anchor (Anti-CF: Su et al. 2023, "Beware of model collapse! Fast and stable test-time adaptation for
  robust question answering"): a KL term toward the frozen source model's output on the same review keeps
  the adapted model from drifting or collapsing onto one class; Anti-CF weighs it against its adaptation
  loss (Tent's entropy there, PCL's consistency here) as (1 - a) x adaptation + a x KL, with a = 0.2 by
  default (this default too). The source's output is the unit's first forward pass (before any update), so
  no second copy of the model is kept.
- Few parameters (LayerNorm affine and bias parameters of the encoder, each once; never the classification
  head): Tent's and BitFit's choice, small enough that a few steps cannot rewrite what the classifier knows.
- Episodic (`ttt.online` and `ttt.draws` are ignored: always off and 1): each unit starts from the source
  weights, so no drift accumulates from unit to unit.

At the source weights the anchor's gradient is zero, so it acts from the second step on: the first step is
the consistency step alone (scaled by 1 - a, which Adam, the default optimizer, sees only through its
epsilon), and each later step weighs agreement with the views against the pull back to the source. `steps` = 1
is PCL without an anchor; a = 1 never moves the weights (its loss is the anchor alone), so its predictions are
the source model's.
Both KL terms are given their exact gradient with respect to the logits, softmax(logits) - target: autograd
through log_softmax gives softmax x (the target's float sum) - target, and the sum's rounding error (about
1e-7) would be a gradient that Adam, which divides by the gradient's own scale, turns into a full step at the
very weights the anchor holds.

Its no-gradient control is `anchored_tta_views` (`ViewAverage` below): the same views' class probabilities
averaged, no update; the difference between the two is the effect of the weight update alone. With
`ttt.mask_prob` = `view_mask_rate` its views are `mask_ensemble`'s first `views` copies.

Of the engines' shared `ttt.*` knobs it takes optimizer, unit, seed (its views' seed), precision, trim_padding
and sub_batch_tokens; its own section replaces lr, steps, views and mask_prob, and the parameters are fixed
(`ttt.params` and `ttt.top_k` do not apply).

Cost per unit: `steps` forward and backward passes over the reviews and their views (views + 1 copies of each
row in one batched forward, so a sub-batch of `sub_batch_tokens` holds views + 1 times its tokens), then one
plain forward.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field

from ttt_pipeline.defenses.base import EngineSettings, EpisodicEngine, MaskFn, RowHashMasker
from ttt_pipeline.defenses.params import layernorm_parameters, select_parameters
from ttt_pipeline.defenses.settings import DefenseSettings

__all__ = ["Settings", "AnchoredTTA", "ViewAverage", "adapted_parameters", "kl_to", "mask_token", "build"]


class Settings(DefenseSettings):
    """`ttt.anchored_tta.*` (its control, anchored_tta_views, uses views, view_mask_rate and the seed too)."""

    lr: float = Field(1e-4, gt=0, description="Learning rate of the anchored TTA steps (Tent's and Anti-CF's).")
    steps: int = Field(2, ge=0, description="Optimizer steps per unit (batch or sample). The anchor acts from the "
                       "second step on (its gradient is zero at the source weights); 0: no update, the plain model's "
                       "prediction.")
    views: int = Field(2, ge=1, description="Perturbed views of each review (masked copies, the same at every step); "
                       "the consistency term averages over them and the control averages their predictions.")
    view_mask_rate: float = Field(0.1, gt=0, lt=1, description="Share of a review's tokens replaced by the mask "
                                  "token in each view (row-hash masks seeded by ttt.seed).")
    confidence: float = Field(0.9, ge=0, le=1, description="A review supplies consistency targets only when its "
                              "prediction's top class probability is at least this (0: every review).")
    anchor_weight: float = Field(0.2, ge=0, le=1, description="Weight a of the KL toward the frozen model's output: "
                                 "loss = (1 - a) x consistency + a x KL(source || adapted) (Anti-CF's 0.2); 1 never "
                                 "moves the weights, 0 is consistency alone.")


def recipe(settings: EngineSettings) -> EngineSettings:
    """Episodic, one draw: each unit adapts from the source weights (see the module docstring)."""
    return settings.model_copy(update=dict(online=False, draws=1))


def adapted_parameters(model) -> list[torch.nn.Parameter]:
    """The encoder's LayerNorm affine parameters and its biases, each once (a LayerNorm bias is both)."""
    seen: set[int] = set()
    out = []
    for p in layernorm_parameters(model) + select_parameters(model, "bias"):
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def kl_to(target_logp: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Per row, KL(target || softmax(logits)) in nats, with the exact gradient softmax(logits) - target with
    respect to the logits (zero, bit for bit, where the logits give the target's own log-probabilities)."""
    logits = logits.float()
    logp = F.log_softmax(logits, dim=-1)
    target = target_logp.exp()
    value = (target * (target_logp - logp.detach())).sum(-1)
    path = ((logp.detach().exp() - target) * logits).sum(-1)
    return value + path - path.detach()


class AnchoredTTA(EpisodicEngine):
    """Consistency with masked views on confident reviews plus a KL anchor to the source (module docstring)."""

    def __init__(self, model, mask_token_id: int, special_ids: list[int], settings: EngineSettings,
                 own: Settings | None = None, mask_fn: MaskFn | None = None):
        own = own or Settings()
        settings = recipe(settings)
        super().__init__(model, settings, adapted_parameters(model), own.lr)
        self.own = own
        self.steps = own.steps
        self.mask_token_id = int(mask_token_id)
        self.mask_fn = mask_fn or RowHashMasker(own.view_mask_rate, special_ids, settings.seed)
        self._unit: dict | None = None
        self.stats.update({"confident_rows": 0, "filtered_rows": 0})

    def view_masks(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[torch.Tensor]:
        """The unit's view masks (draws 0 .. views-1), drawn on the whole unit so sub-batching cannot change them."""
        return [self.mask_fn(input_ids, attention_mask, v).to(input_ids.device).bool() for v in range(self.own.views)]

    def prepare(self, input_ids, attention_mask, step):
        """The unit's views at its first step, kept for the later ones; the source's log-probabilities are
        recorded by the first step's forward passes (`chunk_loss`)."""
        if step == 0 or self._unit is None:
            self._unit = {"n": input_ids.shape[0], "masks": self.view_masks(input_ids, attention_mask),
                          "source": None, "moved": False}
        elif not self._unit["moved"]:  # the first step had no loss (no confident review, or a = 1): the weights
            return None                # are the source's, so no later step has one either
        self._unit["first"] = step == 0
        return self._unit

    def chunk_loss(self, input_ids, attention_mask, rows, ctx):
        """This sub-batch's share of the unit's loss: one forward over the reviews and their views."""
        width, n, a = input_ids.shape[1], input_ids.shape[0], self.own.anchor_weight
        masks = [m[rows, :width] for m in ctx["masks"]]
        views = [input_ids.masked_fill(m, self.mask_token_id) for m in masks]
        logits = self.model(torch.cat([input_ids, *views]), attention_mask.repeat(len(views) + 1, 1)).float()
        orig, view_logits = logits[:n], logits[n:].split(n)
        logp = F.log_softmax(orig, dim=-1)
        target = logp.detach()
        if ctx["first"]:  # the source model's output on these reviews (no update has been taken yet)
            if ctx["source"] is None:
                ctx["source"] = torch.zeros(ctx["n"], logits.shape[-1], device=logits.device)
            ctx["source"][rows] = target
        confident = target.exp().max(-1).values >= self.own.confidence
        if ctx["first"]:
            self.stats["confident_rows"] += int(confident.sum())
            self.stats["filtered_rows"] += int((~confident).sum())
        terms = []
        if bool(confident.any()) and a < 1:
            consistency = torch.stack([kl_to(target, v) for v in view_logits]).mean(0)
            terms.append((1 - a) * consistency[confident].sum())
        if a > 0 and not ctx["first"]:  # at the source weights the anchor is zero, and so is its gradient
            terms.append(a * kl_to(ctx["source"][rows], orig).sum())
        if not terms:
            return None
        ctx["moved"] = True
        return sum(terms) / ctx["n"]

    def _run_unit(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        self._unit = None
        try:
            return super()._run_unit(input_ids, attention_mask)
        finally:
            self._unit = None


class ViewAverage(AnchoredTTA):
    """`anchored_tta_views`, the no-gradient control: log of the mean class probability over the same views
    `AnchoredTTA` adapts on, under the source weights (no optimizer step, no gradient: inference_mode), with
    the same units, sub-batches, padding trim and precision (`EpisodicEngine.forward_nograd`)."""

    def _run_unit(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        self.stats["units"] += 1
        logps = [F.log_softmax(self.forward_nograd(input_ids.masked_fill(m, self.mask_token_id), attention_mask), -1)
                 for m in self.view_masks(input_ids, attention_mask)]
        return torch.logsumexp(torch.stack(logps), dim=0) - math.log(len(logps))


def mask_token(tokenizer) -> int:
    """The id views put in place of a masked token: the mask token, else the unknown token."""
    for token_id in (tokenizer.mask_token_id, tokenizer.unk_token_id):
        if token_id is not None:
            return int(token_id)
    raise ValueError("anchored_tta: the tokenizer has neither a mask token nor an unknown token to build views with")


def build(model, tokenizer, settings: EngineSettings, own: Settings) -> AnchoredTTA:
    """The registry's constructor: the views need the tokenizer's mask token and special ids (no MLM head)."""
    from ttt_pipeline.modeling.model import special_token_ids

    return AnchoredTTA(model, mask_token(tokenizer), special_token_ids(tokenizer), settings, own)
