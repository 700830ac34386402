"""masked_ttt_lower_norm: masked TTT that adapts only the LayerNorm affine parameters and biases of the lower
half of the encoder (and the embeddings' LayerNorm).

Recipe (fixed here): params = `lower_norm` (`ttt_params.lower_norm_parameters`: about 0.1% of MiniLM-L6's
weights), lr = ttt.lr x LR_SCALE. Sources: SAR (Niu et al., ICLR 2023) adapts only normalisation affine
parameters and leaves the top layers' out, whose adaptation is what collapses; TTT-MAE (Gandelsman et al.,
NeurIPS 2022) finds that adapting the lower (encoder) part and keeping the task head's input path fixed is what
makes the self-supervised step help the main task. With Adam every adapted weight moves by about the learning
rate per step, so adapting a few normalisation weights at the tutorial's 3e-5 changes almost nothing: LR_SCALE =
10 (3e-4), as Tent and SAR use a larger rate for normalisation parameters than for full fine-tuning.

Everything else comes from `ttt.*` (mask_prob, steps, optimizer, views, unit, seed, precision).
"""

from __future__ import annotations

from ttt_pipeline.defenses.base import EngineSettings
from ttt_pipeline.defenses.masked_ttt import MaskedTTT

LR_SCALE = 10.0


def recipe(settings: EngineSettings) -> EngineSettings:
    return settings.model_copy(update=dict(params="lower_norm", lr=settings.lr * LR_SCALE))


def build(model, tokenizer, settings: EngineSettings) -> MaskedTTT:
    from ttt_pipeline.modeling.model import special_token_ids

    return MaskedTTT(model, tokenizer.mask_token_id, special_token_ids(tokenizer), recipe(settings))
