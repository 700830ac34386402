"""masked_ttt_anchored: masked TTT that keeps a review's adapted prediction only when the adaptation did what it
was for, and falls back to the source model's prediction otherwise.

Per unit (batch or sample), episodic: predict with the source weights; measure each review's MLM loss on a
held-out mask draw (the first mask index the adaptation never trains on: steps x views, so the check is not
the loss the step just minimised); adapt exactly as `masked_ttt` does; measure the loss again on the same
held-out masks and predict with the adapted weights; restore. A review keeps the adapted prediction only when

- its held-out MLM loss fell (a review with no maskable token has no loss and keeps the source prediction), and
- KL(adapted || source) of its class distribution is at most `ttt.masked_ttt_anchored.kl_budget` nats,

else it gets the source prediction. Budget 0 is the source model, an infinite budget keeps every review whose
loss fell. The default, 0.005 nats, is about the 90th percentile of the tutorial step's KL on a MiniLM-L6
fine-tuned on MDSD electronics (64 kitchen reviews under the tutorial corruption: median 0.0003, 99th percentile
0.010); there the held-out loss fell for 84% and 69% of the reviews of the two batches of 32.

The rule anchors adaptation to the source model, as EATA's anti-forgetting regulariser (Niu et al., ICML 2022)
and SAR's reset to the source weights (Niu et al., ICLR 2023) do, but per review and as a fallback: a review
whose adaptation did not lower its self-supervised loss, or moved its prediction far, keeps the source's.

Recipe (fixed here): episodic (online false) with one draw; everything else, the adaptation included, is
`ttt.*` (the tutorial settings by default). Cost: two more no-gradient MLM forwards and one more classification
forward per unit than `masked_ttt`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from ttt_pipeline.defenses.base import EngineSettings
from ttt_pipeline.defenses.masked_ttt import MaskedTTT
from ttt_pipeline.defenses.settings import DefenseSettings


class Settings(DefenseSettings):
    """`ttt.masked_ttt_anchored.*`."""

    kl_budget: float = Field(
        0.005, ge=0, description="A review keeps its adapted prediction only when its held-out MLM loss fell and "
        "KL(adapted || source) of its class distribution is at most this many nats (0: always the source "
        "prediction; 0.005 is about the 90th percentile of the tutorial step's KL on corrupted MDSD reviews).")


def recipe(settings: EngineSettings) -> EngineSettings:
    return settings.model_copy(update=dict(online=False, draws=1))


def kl_divergence(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row, in nats, of the class distributions of two logit tensors."""
    logp, logq = F.log_softmax(logits_p.float(), -1), F.log_softmax(logits_q.float(), -1)
    return (logp.exp() * (logp - logq)).sum(-1)


class AnchoredTTT(MaskedTTT):
    """MaskedTTT with the per-review fallback to the source prediction (see the module docstring)."""

    def __init__(self, model, mask_token_id: int, special_ids: list[int], settings: EngineSettings,
                 own: Settings | None = None, mask_fn=None):
        settings = recipe(settings)
        super().__init__(model, mask_token_id, special_ids, settings, mask_fn)
        self.kl_budget = (own or Settings()).kl_budget
        self.check_draw = settings.steps * settings.views  # never one of the adaptation's own masks
        self.stats.update({"kept": 0, "fallback_loss": 0, "fallback_kl": 0})
        self.last: dict = {}

    def row_losses(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Mean MLM cross-entropy of each row on its masked tokens under the current weights (NaN: none masked)."""
        n = input_ids.shape[0]
        sums, counts = torch.zeros(n), torch.zeros(n)
        for rows in self.chunks(attention_mask):
            ids, am = self._slice(input_ids, attention_mask, rows)
            m = mask[rows, :ids.shape[1]]
            if not bool(m.any()):
                continue
            with torch.inference_mode(), self._autocast():
                hidden = self.model.encode(ids.masked_fill(m, self.mask_token_id), am)
                ce = self.model.mlm_cross_entropy(hidden, ids, m, "none")
            which = rows.cpu()[m.nonzero()[:, 0].cpu()]
            sums.index_add_(0, which, ce.detach().cpu().clone())
            counts.index_add_(0, which, torch.ones(len(which)))
        return torch.where(counts > 0, sums / counts.clamp(min=1), torch.full_like(sums, float("nan")))

    def _run_draws(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        source = self.forward_nograd(input_ids, attention_mask)
        check = self.mask_fn(input_ids, attention_mask, self.check_draw).to(input_ids.device).bool()
        before = self.row_losses(input_ids, attention_mask, check)
        self.adapt(input_ids, attention_mask)
        after = self.row_losses(input_ids, attention_mask, check)
        adapted = self.forward_nograd(input_ids, attention_mask)
        self._restart()
        kl = kl_divergence(adapted, source).cpu()
        fell = after < before  # NaN (nothing masked) compares False: the source prediction
        within = kl <= self.kl_budget
        keep = fell & within
        self.stats["kept"] += int(keep.sum())
        self.stats["fallback_loss"] += int((~fell).sum())
        self.stats["fallback_kl"] += int((fell & ~within).sum())
        self.last = {"keep": keep, "loss_before": before, "loss_after": after, "kl": kl}
        return torch.where(keep.to(source.device)[:, None], adapted, source)


def build(model, tokenizer, settings: EngineSettings, own: Settings) -> AnchoredTTT:
    from ttt_pipeline.modeling.model import special_token_ids

    return AnchoredTTT(model, tokenizer.mask_token_id, special_token_ids(tokenizer), settings, own)
