"""masked_ttt_sgd: masked TTT with several steps of SGD with momentum instead of one Adam step.

Recipe (fixed here): STEPS = 3 optimizer steps per unit with SGD, MOMENTUM = 0.9, at lr = ttt.lr x LR_SCALE.
Source: TTT-MAE (Gandelsman et al., NeurIPS 2022) adapts with SGD and momentum 0.9 over several steps, where
the tutorial recipe takes one Adam step. Adam's first step moves every weight by about its learning rate in
the sign of the gradient whatever the gradient's size; SGD moves it by lr x gradient, so it needs a far larger
learning rate for a comparable move: LR_SCALE = 500 maps the tutorial's Adam 3e-5 to SGD 1.5e-2, whose first
step moves the weights of a MiniLM-L6 fine-tuned on MDSD electronics (the mdsd-electronics preset) by a
root-mean-square 3.2e-5, against 2.9e-5 for the tutorial's Adam step (`rms_update`, one batch of 32 kitchen
reviews under the tutorial corruption); momentum then lets the next steps move further.

Each step draws fresh masks (steps x views masks per unit); the optimizer's momentum starts from zero for every
unit (episodic), as `drop_optimizer_state` frees SGD's momentum buffer. Everything else comes from `ttt.*`
(mask_prob, lr, params, views, unit, seed, precision).
"""

from __future__ import annotations

import torch

from ttt_pipeline.defenses.base import EngineSettings
from ttt_pipeline.defenses.masked_ttt import MaskedTTT
from ttt_pipeline.defenses.params import make_optimizer

STEPS = 3
MOMENTUM = 0.9
LR_SCALE = 500.0


def recipe(settings: EngineSettings) -> EngineSettings:
    return settings.model_copy(update=dict(steps=STEPS, optimizer="sgd", lr=settings.lr * LR_SCALE))


class MomentumSGDTTT(MaskedTTT):
    """MaskedTTT whose optimizer is SGD with momentum (the base engine's SGD has none)."""

    def __init__(self, model, mask_token_id: int, special_ids: list[int], settings: EngineSettings,
                 momentum: float = MOMENTUM, mask_fn=None):
        super().__init__(model, mask_token_id, special_ids, settings, mask_fn)
        self.opt = make_optimizer(self.flat.flat, "sgd", settings.lr, momentum=momentum)


def build(model, tokenizer, settings: EngineSettings) -> MomentumSGDTTT:
    from ttt_pipeline.modeling.model import special_token_ids

    return MomentumSGDTTT(model, tokenizer.mask_token_id, special_token_ids(tokenizer), recipe(settings))


def rms_update(engine: MaskedTTT, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> float:
    """Root-mean-square change of the adapted weights after adapting on one unit (then restored): how far a
    recipe moves the model, to compare optimizers and learning rates."""
    engine.model.eval()
    engine.adapt(input_ids, attention_mask)
    with torch.no_grad():
        source = engine.flat.source_values()
        moved = torch.cat([(f.data - s).float().reshape(-1) for f, s in zip(engine.flat.flat, source)])
    engine.reset()
    return float(moved.pow(2).mean().sqrt())
