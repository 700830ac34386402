"""The no-gradient control of masked TTT: average the predictions over the masked copies TTT would train on.

Masked TTT changes two things at once: it shows the model masked inputs and it takes gradient steps on
them. This engine keeps the first and drops the second, so the difference between the two is the effect
of the weight update alone. Copy k is the input with mask_fn(ids, am, k) replaced by [MASK]: with the
default row-hash masker and the same `settings.seed` these are exactly the masks MaskedTTT draws
(its mask index ((draw x steps) + step) x views + view runs over 0 .. views x steps x draws - 1).

copies = views x steps x draws (every mask TTT would use) when that is above 1; a single mask would be
one noisy copy, not an ensemble, so the default TTT recipe (1 x 1 x 1) gets 4 copies (masks 0-3).

The result is the log of the mean class probability over the copies (float32), computed as a logsumexp.
Nothing is trained: inference_mode, model.eval(), weights never touched; `settings.precision` is
honoured like EpisodicEngine (`amp`, set by registry.build_engine). Row-hash masks make each row's result independent of
the batch it is in.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch

from ttt_pipeline.defenses.base import EngineSettings, MaskFn, RowHashMasker, trim_padding

__all__ = ["MaskEnsemble", "default_copies"]

SINGLE_MASK_COPIES = 4  # copies when TTT itself would use one mask


def default_copies(settings: EngineSettings) -> int:
    """Every mask masked TTT would draw (views x steps x draws), or SINGLE_MASK_COPIES if that is 1."""
    n = settings.views * settings.steps * settings.draws
    return n if n > 1 else SINGLE_MASK_COPIES


class MaskEnsemble:
    """Class logits = log mean softmax of the model over `copies` masked copies of the input."""

    def __init__(self, model, mask_token_id: int, special_ids: list[int], settings: EngineSettings,
                 copies: int | None = None, mask_fn: MaskFn | None = None):
        self.model = model
        self.s = settings
        self.mask_token_id = int(mask_token_id)
        self.copies = default_copies(settings) if copies is None else int(copies)
        if self.copies < 1:
            raise ValueError(f"copies must be >= 1, got {self.copies}")
        self.mask_fn = mask_fn or RowHashMasker(settings.mask_prob, special_ids, settings.seed)
        self.device = next(model.parameters()).device
        self.amp = None  # the autocast dtype (None: fp32); registry.build_engine sets the run's scoring precision

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp) if self.amp is not None else nullcontext()

    def predict(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B x classes) float32 log of the mean softmax over the masked copies; weights unchanged."""
        out_device = input_ids.device
        ids, am = input_ids.to(self.device), attention_mask.to(self.device)
        if self.s.trim_padding:
            ids, am = trim_padding(ids, am)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                logps = []
                for k in range(self.copies):
                    mask = self.mask_fn(ids, am, k).to(self.device).bool()
                    with self._autocast():
                        logits = self.model(ids.masked_fill(mask, self.mask_token_id), am)
                    logps.append(torch.log_softmax(logits.float(), dim=-1))
                out = torch.logsumexp(torch.stack(logps), dim=0) - math.log(self.copies)
        finally:
            self.model.train(was_training)
        return out.clone().to(out_device)  # a normal tensor (inference tensors cannot enter autograd later)

    __call__ = predict

    def close(self) -> None:
        """Nothing to give back: the model was never changed."""


def build(model, tokenizer, settings: EngineSettings) -> MaskEnsemble:
    """The registry's constructor: as many masked copies as masked TTT would draw masks (`default_copies`)."""
    from ttt_pipeline.modeling.model import special_token_ids

    return MaskEnsemble(model, tokenizer.mask_token_id, special_token_ids(tokenizer), settings)
