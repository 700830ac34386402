"""masked_ttt_views: masked TTT whose every step averages the MLM loss over several masked views of the unit.

Recipe (fixed here): VIEWS = 4 independently masked copies of each review per step, run as one forward (the
copies are stacked into one batch by `MaskedTTT.chunk_loss`); the step is on the mean over views of each view's
mean MLM cross-entropy. Source: TTT-MAE (Gandelsman et al., NeurIPS 2022) takes each test-time step on a batch
of several random maskings of the same test input rather than on one mask, which lowers the noise of a step
taken on a single input.

Everything else comes from `ttt.*` (mask_prob, steps, lr, optimizer, params, unit, seed, precision): the
recipe changes only the number of views. Its no-gradient control is `mask_ensemble`, which with these settings
averages the predictions over the same 4 x steps masks.
"""

from __future__ import annotations

from ttt_pipeline.defenses.base import EngineSettings
from ttt_pipeline.defenses.masked_ttt import MaskedTTT

VIEWS = 4


def recipe(settings: EngineSettings) -> EngineSettings:
    """The `ttt.*` settings with this recipe's fixed values."""
    return settings.model_copy(update=dict(views=VIEWS))


def build(model, tokenizer, settings: EngineSettings) -> MaskedTTT:
    from ttt_pipeline.modeling.model import special_token_ids

    return MaskedTTT(model, tokenizer.mask_token_id, special_token_ids(tokenizer), recipe(settings))
