"""Tent: test-time entropy minimisation of the encoder's LayerNorm affine parameters.

Wang et al. (ICLR 2021) adapt normalisation affine parameters to minimise the entropy of the model's own
predictions. Transformers have LayerNorm instead of BatchNorm, so the encoder's LayerNorm weights and biases
are adapted. Dropout is off (eval mode), `ttt.tent.steps` steps at `ttt.tent.lr` with the configured optimizer
(`ttt.optimizer`), and the engine is episodic like the masked one (restore in place after each unit) unless online.
"""

from __future__ import annotations

import torch.nn.functional as F
from pydantic import Field

from ttt_pipeline.defenses.base import EngineSettings, EpisodicEngine
from ttt_pipeline.defenses.params import layernorm_parameters
from ttt_pipeline.defenses.settings import DefenseSettings


class Settings(DefenseSettings):
    """`ttt.tent.*` (tent_filtered, Tent with a filter, uses them too)."""

    lr: float = Field(1e-4, gt=0, description="Learning rate of Tent (entropy minimisation).")
    steps: int = Field(1, ge=1, description="Tent steps per batch.")


class TentEngine(EpisodicEngine):
    """`build_engine("tent", ...)`: .predict(input_ids, attention_mask) -> logits after entropy steps."""

    def __init__(self, model, settings: EngineSettings, own: Settings | None = None):
        own = own or Settings()
        super().__init__(model, settings, layernorm_parameters(model), own.lr)
        self.steps = own.steps

    def prepare(self, input_ids, attention_mask, step):
        return {"n": input_ids.shape[0]}

    def chunk_loss(self, input_ids, attention_mask, rows, ctx):
        """This sub-batch's share of the mean Shannon entropy of the class distribution over the unit."""
        logp = F.log_softmax(self.model(input_ids, attention_mask).float(), dim=-1)
        return -(logp.exp() * logp).sum() / ctx["n"]


def build(model, tokenizer, settings: EngineSettings, own: Settings) -> TentEngine:
    """The registry's constructor: Tent needs no tokenizer (its loss is the prediction's entropy)."""
    return TentEngine(model, settings, own)
