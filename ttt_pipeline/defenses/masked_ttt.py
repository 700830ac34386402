"""Masked test-time training: adapt on the MLM loss of each test unit, predict, restore.

The algorithm is torch-ttt 0.0.2's `MaskedTTTEngine` (mask non-special, non-padding tokens with probability
`mask_prob`, cross-entropy of the MLM head on the masked positions, `steps` optimizer steps at `lr`, then a
prediction without gradients), re-implemented without its costs on `EpisodicEngine` (base.py: episodic
restore through one flat buffer, reproducible row-hash masks, sub-batching, precision). The MLM head runs
only on the masked positions, and never on the prediction pass.
"""

from __future__ import annotations

import torch

from ttt_pipeline.defenses.base import EngineSettings, EpisodicEngine, MaskFn, RowHashMasker
from ttt_pipeline.defenses.params import select_parameters

HELDOUT_DRAW = -2  # mask draws of adaptation steps are numbered from 0: this one is never stepped on


class MaskedTTT(EpisodicEngine):
    """Masked-LM test-time training over a ReviewClassifier (see the module docstring)."""

    def __init__(self, model, mask_token_id: int, special_ids: list[int], settings: EngineSettings,
                 mask_fn: MaskFn | None = None):
        # The classification head gets no gradient from the MLM loss: leave it out of the buffer (torch-ttt
        # hands it to Adam, which skips it for want of a gradient; same result).
        head = {id(p) for p in model.head.parameters()} if hasattr(model, "head") else set()
        params = [p for p in select_parameters(model, settings.params, settings.top_k) if id(p) not in head]
        super().__init__(model, settings, params, settings.lr)
        self.steps = settings.steps
        self.draws = settings.draws
        self.mask_token_id = mask_token_id
        self.mask_fn = mask_fn or RowHashMasker(settings.mask_prob, special_ids, settings.seed)
        self.heldout_fn = RowHashMasker(settings.mask_prob, special_ids, settings.seed)  # draw HELDOUT_DRAW

    def probe(self, input_ids, attention_mask):
        """Held-out masks: a draw of their own, minus every position the unit's first draw steps on."""
        stepped = torch.zeros_like(input_ids, dtype=torch.bool)
        for step in range(self.steps):
            for v in range(self.s.views):
                stepped |= self.mask_fn(input_ids, attention_mask, step * self.s.views + v).to(input_ids.device).bool()
        held = self.heldout_fn(input_ids, attention_mask, HELDOUT_DRAW).to(input_ids.device).bool() & ~stepped
        return {"mask": held} if bool(held.any()) else None

    def probe_loss(self, input_ids, attention_mask, ctx) -> float:
        """Mean MLM cross-entropy on the held-out positions, without gradients, sub-batch by sub-batch."""
        total, n = 0.0, 0
        with torch.inference_mode(), self._autocast():
            for rows in self.chunks(attention_mask):
                ids, am = self._slice(input_ids, attention_mask, rows)
                mask = ctx["mask"][rows, :ids.shape[1]]
                if not bool(mask.any()):
                    continue
                hidden = self.model.encode(ids.masked_fill(mask, self.mask_token_id), am)
                total += float(self.model.mlm_cross_entropy(hidden, ids, mask, "sum"))
                n += int(mask.sum())
        return total / max(n, 1)

    def prepare(self, input_ids, attention_mask, step):
        """The unit's masks for every view, drawn on the whole unit (so sub-batching cannot change them),
        and each view's weight 1 / (masked tokens in the view x views with any masked token)."""
        views = self.s.views
        masks = [self.mask_fn(input_ids, attention_mask, step * views + v).to(input_ids.device).bool()
                 for v in range(views)]
        counts = [int(m.sum()) for m in masks]
        live = [v for v in range(views) if counts[v] > 0]
        if not live:
            return None
        return {"masks": [masks[v] for v in live], "scale": [1.0 / (counts[v] * len(live)) for v in live]}

    def chunk_loss(self, input_ids, attention_mask, rows, ctx):
        """This sub-batch's share of mean-over-views(mean MLM cross-entropy on the view's masked tokens);
        all views run as one forward; the MLM head only sees the masked positions."""
        width = input_ids.shape[1]
        masks = [m[rows, :width] for m in ctx["masks"]]
        n = len(masks)
        mask = masks[0] if n == 1 else torch.cat(masks)
        if not bool(mask.any()):
            return None
        ids = input_ids if n == 1 else input_ids.repeat(n, 1)
        am = attention_mask if n == 1 else attention_mask.repeat(n, 1)
        hidden = self.model.encode(ids.masked_fill(mask, self.mask_token_id), am)
        ce = self.model.mlm_cross_entropy(hidden, ids, mask, "none")
        if n == 1:
            return ce.sum() * ctx["scale"][0]
        per_view = [int(m.sum()) for m in masks]
        return sum(part.sum() * s for part, s in zip(ce.split(per_view), ctx["scale"]))


def build(model, tokenizer, settings: EngineSettings) -> MaskedTTT:
    """The registry's constructor: `masked_ttt` with the `ttt.*` settings as they are."""
    from ttt_pipeline.modeling.model import special_token_ids

    return MaskedTTT(model, tokenizer.mask_token_id, special_token_ids(tokenizer), settings)
