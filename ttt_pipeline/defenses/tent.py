"""Tent: test-time entropy minimisation of the encoder's LayerNorm affine parameters.

Wang et al. (ICLR 2021) adapt normalisation affine parameters to minimise the entropy of the model's own
predictions. Transformers have LayerNorm instead of BatchNorm, so the encoder's LayerNorm weights and biases
are adapted. Dropout is off (eval mode), `tent_steps` steps at `tent_lr` with the configured optimizer, and
the engine is episodic like the masked one (restore in place after each unit) unless online.
"""

from __future__ import annotations

import torch.nn.functional as F

from ttt_pipeline.defenses.base import EpisodicEngine, TTTSettings
from ttt_pipeline.defenses.params import layernorm_parameters


class TentEngine(EpisodicEngine):
    """`build_engine("tent", ...)`: .predict(input_ids, attention_mask) -> logits after entropy steps."""

    def __init__(self, model, settings: TTTSettings):
        super().__init__(model, settings, layernorm_parameters(model), settings.tent_lr)
        self.steps = settings.tent_steps

    def prepare(self, input_ids, attention_mask, step):
        return {"n": input_ids.shape[0]}

    def chunk_loss(self, input_ids, attention_mask, rows, ctx):
        """This sub-batch's share of the mean Shannon entropy of the class distribution over the unit."""
        logp = F.log_softmax(self.model(input_ids, attention_mask).float(), dim=-1)
        return -(logp.exp() * logp).sum() / ctx["n"]


def build(model, tokenizer, settings: TTTSettings) -> TentEngine:
    """The registry's constructor: Tent needs no tokenizer (its loss is the prediction's entropy)."""
    return TentEngine(model, settings)
